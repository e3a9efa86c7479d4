#pragma once
// Where a run's input files are looked up: the current directory, then the
// source tree's data/ and configs/ folders (so the README's commands work
// from any directory).

#include <string>

namespace crucible {

/// Finds a data file: `path` itself if absolute or present relative to the
/// current directory; else, for a path starting with "data/", the same file
/// under the source tree's data/ folder (CRUCIBLE_DATA_DIR).
/// @throws DataError "<key> file '<path>' does not exist (looked in: ...)".
std::string resolve_data_path(const std::string& path, const std::string& key);

/// The --config file `path`: as given when it is a file, else (a relative
/// path starting with configs/) the same file in the source tree's configs/
/// folder, as data/ paths fall back (issue 47).
/// @throws ConfigError listing the places looked in.
std::string resolve_config_path(const std::string& path);

}  // namespace crucible
