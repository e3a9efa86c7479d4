#pragma once
// A training run from its recipe to its run directory: `crucible train`
// and `crucible.train` (Python) both call run_training. Layers: docs/
// architecture/layers.md.

#include "crucible/config/config.h"
#include "crucible/training/hook.h"
#include "crucible/training/metrics.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace crucible {

/// What `run_training` produced.
struct TrainResult {
  std::string run_dir;                  ///< directory written.
  ValidationSummary validation;         ///< final validation metrics (meV units).
  double wall_seconds = 0;              ///< total wall time of the command, s.
  int64_t steps = 0;                    ///< optimizer steps taken.
  int64_t epochs = 0;                   ///< epochs completed.
  bool stopped = false;                 ///< stopped before its end (resumable).
  /// The signal that stopped it (SIGINT 2, SIGTERM 15; SIGTERM when the stop
  /// was agreed with another worker that got one); 0 when not stopped or
  /// stopped at a hook's request (TrainingStrategy::request_stop()).
  int signal = 0;
};

/// `crucible train --resume RUN_DIR [--checkpoint N]`.
struct ResumeOptions {
  bool resume = false;                 ///< continue config.output.run_dir.
  std::optional<int64_t> checkpoint;   ///< checkpoint index; unset = newest intact.
};

/// A training run in the calling process (`crucible train`, `crucible.train`):
/// reads and checks all data and the config (build_training), then creates
/// the run directory (config.yaml first, summary.json last), trains, saves
/// model.pt / model.json and prints the header, progress and a final summary
/// to `out` (warnings to `err`). `command_line` is recorded in config.yaml.
/// `hooks` (e.g. Python hooks) are registered after the configured update
/// hooks and before the progress, metrics and checkpoint hooks, so a
/// checkpoint and the metrics files see what they changed in the same stage.
///
/// With `resume.resume`: the run directory must hold an unfinished run
/// (config.yaml, checkpoints/, no summary.json); its recipe must not differ
/// from `config` in a key that matters (recipe_differences: ConfigError
/// listing them); the checkpoint is restored (the newest intact one, saying
/// which newer ones were skipped and why) and training continues at the
/// exact next batch; metrics files are appended to.
/// A SIGINT/SIGTERM during training, or a hook's request_stop(), finishes
/// the batch, writes a checkpoint and returns (TrainResult::stopped) after
/// printing how to resume.
/// @throws ConfigError / DataError for user errors, before the run directory
///         is created when they concern the inputs; TrainingError for a
///         non-finite loss or a lost metrics line (naming how to resume);
///         what a hook throws (the newest checkpoint written before it is
///         the one `--resume` continues from).
TrainResult run_training(const Config& config, std::ostream& out, std::ostream& err,
                         const std::string& command_line = "", const ResumeOptions& resume = {},
                         const std::vector<std::shared_ptr<Hook>>& hooks = {});

}  // namespace crucible
