#pragma once
// A run directory's life (issue 15): chosen, checked under the run lock
// (crucible/run/run_lock.h), probed for space, emptied of an overwritten
// run's files, written atomically. Layout: config.yaml first, checkpoints/,
// metrics.csv / metrics.jsonl / learning_curve.svg, model.pt / model.json,
// summary.json last (a run is finished when summary.json parses).

#include "crucible/config/config.h"

#include <filesystem>
#include <string>

namespace crucible {

/// The run directory to use: output.run_dir, or runs/<YYYYmmdd-HHMMSS>
/// (with -2, -3, ... when taken) when unset. Nothing in it is looked at.
/// @throws ConfigError if output.run_dir names an existing file.
std::filesystem::path choose_run_dir(const OutputConfig& output);

/// True when `dir` holds a finished run: a summary.json that parses as a
/// JSON object with "steps" (summary.json is written last and atomically; an
/// empty or torn one, e.g. cut by a full disk, is not a finish). Never throws.
bool finished_run(const std::filesystem::path& dir);

/// Under the run-directory lock: refuses a finished or non-empty directory
/// unless output.overwrite. @throws ConfigError naming output.run_dir and
/// the key that allows it.
void check_run_dir(const std::filesystem::path& dir, const OutputConfig& output);

/// Writes, fsyncs and removes a 1 MiB file in `dir`: an unwritable,
/// read-only or full run directory is found before anything is trained or
/// removed. @throws DataError naming the directory and the system's reason.
void probe_writable(const std::filesystem::path& dir);

/// Creates `dir`, probes it (probe_writable) and removes a previous run's
/// files (summary.json first, so the directory never looks finished).
/// @throws DataError naming the directory or file that failed.
void prepare_run_dir(const std::filesystem::path& dir);

/// Writes `text` to `path` through a `path`.tmp file and a rename, so a
/// reader sees the old file or the whole new one.
/// @throws DataError naming the file.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace crucible
