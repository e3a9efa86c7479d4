#pragma once
// Typed exceptions: user errors (bad files, bad configs) are not bugs.

#include <stdexcept>
#include <string>

namespace crucible {

/// Bad input data (a file the user gave us). The message always starts with
/// "<file>:<line>: " when a line is known, then "<what> must be <expected>,
/// got <actual>".
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad configuration (YAML key, command-line override, option value). The
/// message names the dotted key path, e.g. "training.optimizer.lr".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A run that cannot continue for a reason found while training (a
/// non-finite loss, a checkpoint that cannot be written). The message says
/// what happened, at which step, what was kept, and how to go on.
class TrainingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A metrics file (metrics.csv, metrics.jsonl) could not be written (a full
/// disk, a file-size limit): the run stops like after a failed checkpoint
/// (issue 15). The message names the file and the system's reason.
class MetricsWriteError : public TrainingError {
 public:
  using TrainingError::TrainingError;
};

}  // namespace crucible
