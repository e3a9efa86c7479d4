#pragma once
// Internal: manifest.json <-> CheckpointEntry, names of checkpoint folders.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crucible/checkpoint/checkpoint_store.h"

namespace crucible::checkpoint::detail {

/// "ckpt-<index:06>" for revision 0, "ckpt-<index:06>.r<revision>" otherwise.
std::string checkpoint_dir_name(std::int64_t index, std::int64_t revision);

/// Inverse of checkpoint_dir_name: {index, revision}, or nullopt when `name`
/// is not exactly such a name (no sign, index with at least 6 digits and no
/// superfluous leading zeros beyond the padding, revision >= 1 without
/// leading zeros).
std::optional<std::pair<std::int64_t, std::int64_t>> parse_dir_name(const std::string& name);

/// Parses and validates manifest text; `path` prefixes every DataError.
/// Entries come back sorted by index.
std::vector<CheckpointEntry> parse_manifest(const std::string& text, const std::string& path);

/// Serializes entries (sorted by index) as schema_version 1, ending in '\n'.
std::string dump_manifest(const std::vector<CheckpointEntry>& entries);

}  // namespace crucible::checkpoint::detail
