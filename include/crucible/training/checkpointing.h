#pragma once
// Checkpoints of a training run (issue 5; seed 002 save_checkpoint /
// restore_checkpoint): the strategy's state_files() in a CheckpointStore,
// and a hook that writes them on a cadence, at the end, and on SIGINT/SIGTERM.

#include "crucible/checkpoint/checkpoint_store.h"
#include "crucible/training/hook.h"
#include "crucible/training/strategy.h"

#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// Name of the file, in every checkpoint, that describes the strategy's
/// models (JSON): {"<model name>": {"name": EnergyModel::name(), "cutoff": Å,
/// "elements": [Z...], "num_parameters": n}}. same_models_validator reads it.
inline constexpr const char* kModelsInfoFile = "models.json";

/// Name of the file, in every checkpoint, with the strategy's declarative
/// options (TrainingStrategy::to_spec(); seed 002's checkpoint spec), read
/// by TrainingStrategy::load_checkpoint.
inline constexpr const char* kStrategySpecFile = "strategy.json";

/// models.json's text for `strategy` (see kModelsInfoFile). Never throws.
std::string models_info_json(const TrainingStrategy& strategy);

/// Writes `strategy.state_files()` plus models.json, strategy.json (and `extra_files`,
/// e.g. the recipe as "recipe.json") as checkpoint `index` (-1 appends),
/// with the counters (step, epoch, batch, epoch_step, global_step) and, when
/// `metric` names a ValidationSummary::as_map() key and a validation exists,
/// that metric (for RetentionPolicy::keep_best_by).
/// @throws as CheckpointStore::save (the previous checkpoints stay intact),
///   e.g. std::invalid_argument when an extra file's name clashes with a state file.
checkpoint::CheckpointEntry save_checkpoint(
    checkpoint::CheckpointStore& store, TrainingStrategy& strategy, int64_t index = -1,
    const std::string& metric = "",
    const std::vector<std::pair<std::string, std::string>>& extra_files = {});

/// What a failed write leaves to resume from, for its message: "the newest,
/// ckpt-000001 (step 2), is intact", "no earlier checkpoint", or "the
/// manifest cannot be read either". Never throws.
std::string describe_newest_checkpoint(const checkpoint::CheckpointStore& store);

/// The advice that fits why a checkpoint write failed (issue 15): a full
/// disk or quota (ENOSPC, EDQUOT), a file-size limit (EFBIG), a permission
/// error (EACCES, EPERM), a read-only file system (EROFS), a held lock; read
/// from a std::system_error's code or the system's message in what().
/// Never throws.
std::string write_failure_advice(const std::exception& e);

/// A checkpoint read and verified but not yet applied: what a
/// CheckpointValidator sees (seed 002's loaded-checkpoint validators).
struct LoadedCheckpoint {
  checkpoint::CheckpointEntry entry;  ///< manifest entry (index, counters, files)
  checkpoint::CheckpointFiles files;  ///< file name -> bytes, all checksums verified
};

/// Runs on a loaded checkpoint before anything is applied; throws
/// (DataError / ConfigError, naming the file and what differs) to refuse it.
using CheckpointValidator = std::function<void(const LoadedCheckpoint&)>;

/// A validator that refuses a checkpoint whose models.json differs from
/// `strategy`'s models: the same model names, and for each the same kind
/// (EnergyModel::name), cutoff (to 1e-12 Å), elements and parameter count,
/// and for a registered model (crucible/models/registry.h) the same
/// hyperparameters (its factory's to_json; skipped for checkpoints written
/// before models.json recorded them).
/// Captures the strategy by reference: it must outlive the validator.
/// The returned validator throws DataError listing every difference.
CheckpointValidator same_models_validator(const TrainingStrategy& strategy);

/// What restore_checkpoint used.
struct RestoredCheckpoint {
  int64_t index = -1;
  /// Newer checkpoints that failed verification, with the reason (names the file).
  std::vector<checkpoint::CheckpointFailure> skipped;
};

/// Loads and verifies checkpoint `index`, or the newest intact one when
/// unset (newer damaged ones go to `skipped`, which may be null).
/// @throws DataError if the store has no intact checkpoint (listing why) or
///   the requested one fails verification (naming the file).
LoadedCheckpoint load_checkpoint(const checkpoint::CheckpointStore& store,
                                 std::optional<int64_t> index = std::nullopt,
                                 std::vector<checkpoint::CheckpointFailure>* skipped = nullptr);

/// Restores checkpoint `index`, or the newest intact one when unset (newer
/// corrupted ones are listed in `skipped`), into an already constructed
/// `strategy` (seed 002 restore_checkpoint): load_checkpoint, then every
/// validator in order, then restore_state_files. Nothing is applied unless
/// all validators pass.
/// @throws DataError if the store has no intact checkpoint (listing why), the
///   requested one fails verification (naming the file), or its files do
///   not fit the strategy; whatever a validator throws.
RestoredCheckpoint restore_checkpoint(const checkpoint::CheckpointStore& store,
                                      TrainingStrategy& strategy,
                                      std::optional<int64_t> index = std::nullopt,
                                      const std::vector<CheckpointValidator>& validators = {});

/// Options of CheckpointHook.
struct CheckpointHookOptions {
  int64_t every_n_steps = 0;   ///< after every n-th optimizer step (0 = off), >= 0.
  int64_t every_n_epochs = 1;  ///< after every n-th epoch (0 = off), >= 0.
  bool at_end = true;          ///< after training (after the final validation).
  /// On SIGINT / SIGTERM: finish the current batch, write a checkpoint, and
  /// make run() return (TrainingStrategy::request_stop). Default true.
  bool on_signal = true;
  std::string metric = "forces_mae";  ///< recorded with each checkpoint ("" = none).
  /// Written into every checkpoint next to the state (name -> bytes), e.g.
  /// the run's recipe as "recipe.json" for load_training_from_checkpoint.
  std::vector<std::pair<std::string, std::string>> extra_files;
  /// Called at every save; the files it returns are written next to the
  /// state (e.g. how far each metrics file had been written, issue 15).
  /// Empty = none.
  std::function<std::vector<std::pair<std::string, std::string>>()> dynamic_files;
};

/// Writes checkpoints at the strategy's boundaries (TrainingStrategy::
/// add_boundary_callback, registered at SETUP), so every checkpoint resumes
/// exactly: after a batch whose step count is a multiple of every_n_steps,
/// after every every_n_epochs-th epoch, at the end, and whenever the run
/// stops early (a signal, another worker's agreed stop, request_stop()). Never writes twice for the same batch_count. In a
/// data-parallel run only global rank 0 writes (all workers hold the same
/// state); the others still handle signals, and the strategy agrees on the
/// stop so every worker stops at the same batch.
///
/// Signals: enter() installs SIGINT and SIGTERM handlers that only set a
/// flag (async-signal-safe); exit() restores the previous handlers. At
/// AFTER_BATCH the flag makes the hook call request_stop(); the stop
/// boundary then writes the checkpoint. `signal_received()` says whether it
/// happened (the CLI prints how to resume).
///
/// A failed write (full disk, I/O error, file-size limit) leaves every
/// earlier checkpoint as it was (the store writes a new folder and renames
/// the manifest last) and ends the run with a TrainingError: "checkpoint at
/// step S could not be written to DIR: <why>; earlier checkpoints are
/// unchanged (the newest, ckpt-N (step K), is intact). ...".
class CheckpointHook : public Hook {
 public:
  /// @throws ConfigError for negative cadences; std::invalid_argument for a null store.
  CheckpointHook(std::shared_ptr<checkpoint::CheckpointStore> store,
                 CheckpointHookOptions options = {});
  std::string name() const override { return "CheckpointHook"; }
  bool runs_on_stage(TrainingStage stage) const override;
  void operator()(TrainContext& ctx, TrainingStage stage) override;
  void enter() override;
  void exit(bool failed) override;

  /// Entries written by this hook, in order.
  const std::vector<checkpoint::CheckpointEntry>& written() const { return written_; }
  bool signal_received() const { return signal_received_; }
  /// The signal that stopped the run (SIGINT or SIGTERM), 0 if none.
  int signal_number() const { return signal_number_; }
  /// Sets the flag a SIGINT/SIGTERM would set (tests, embedding apps).
  static void simulate_signal(int sig = SIGTERM);

 private:
  void on_boundary(TrainingStrategy& s, TrainingStrategy::Boundary b);
  std::shared_ptr<checkpoint::CheckpointStore> store_;
  CheckpointHookOptions options_;
  std::vector<checkpoint::CheckpointEntry> written_;
  int64_t last_saved_batch_ = -1;
  bool registered_ = false;
  bool signal_received_ = false;
  int signal_number_ = 0;
  bool handlers_installed_ = false;
};

}  // namespace crucible
