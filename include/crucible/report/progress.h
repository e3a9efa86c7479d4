#pragma once
// Reporting hooks of `crucible train`: a live progress bar for terminals, a
// per-epoch progress line on stdout and a metrics.csv file.

#include "crucible/training/hook.h"
#include "crucible/training/metrics.h"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace crucible {

/// One row of the training log: an epoch (or the final partial epoch).
struct EpochRecord {
  int64_t epoch = 0;            ///< completed epochs (1-based number of this epoch).
  int64_t step = 0;             ///< optimizer steps so far.
  int64_t batches = 0;          ///< batches in this epoch (so far).
  int64_t structures = 0;       ///< structures trained on in this epoch.
  double train_loss = 0;        ///< mean total loss over this epoch's batches.
  std::map<std::string, double> train_components;  ///< mean unweighted loss terms.
  double epoch_seconds = 0;     ///< training wall time of this epoch (no validation), s.
  double elapsed_seconds = 0;   ///< wall time since the hook was entered, s.
  std::optional<ValidationSummary> validation;  ///< set if validated after this epoch.
  bool final = false;           ///< the validation after training (not an epoch end).
};

/// Collects per-epoch statistics and emits one EpochRecord per epoch.
///
/// Runs on BEFORE_EPOCH, AFTER_BATCH, AFTER_EPOCH and AFTER_VALIDATION. At
/// AFTER_EPOCH the record is emitted at once unless
/// `strategy->validation_due_after_epoch()`, in which case it is emitted at
/// the AFTER_VALIDATION that follows, with the validation metrics. The
/// validation after training emits a record with `final = true` only if it
/// adds information (a partial epoch or an epoch that was not validated).
class EpochReportHook : public Hook {
 public:
  bool runs_on_stage(TrainingStage stage) const override;
  void operator()(TrainContext& ctx, TrainingStage stage) override;
  void enter() override;

  /// The last validation seen (after training: the final metrics).
  const std::optional<ValidationSummary>& last_validation() const { return last_validation_; }
  /// Every record emitted so far.
  const std::vector<EpochRecord>& records() const { return records_; }

  /// Issue 15: what a resumed run needs to continue this hook's records
  /// exactly, as JSON text: the open epoch's running means and counts, the
  /// last record (without its validation), what was emitted last. Taken at
  /// a checkpoint. Never throws.
  std::string state_json() const;
  /// Continues from a state_json() at the next enter() (which otherwise
  /// starts empty). @throws DataError naming `source` for unreadable JSON.
  void resume_from(const std::string& state_json, const std::string& source);

 protected:
  /// Called once per emitted record.
  virtual void report(const EpochRecord& record) = 0;

 private:
  void emit(EpochRecord record);
  EpochRecord current_;
  std::chrono::steady_clock::time_point start_, epoch_start_;
  bool epoch_open_ = false;      // BEFORE_EPOCH seen, AFTER_EPOCH not yet
  bool pending_ = false;         // epoch finished, waiting for its validation
  int64_t last_emitted_step_ = -1;
  bool last_emitted_validated_ = false;
  std::optional<ValidationSummary> last_validation_;
  std::optional<std::string> resume_state_;  ///< applied by the next enter()
  std::vector<EpochRecord> records_;
};

/// Prints one line per epoch:
/// `epoch   3/60  step    222  loss 1.234e-02  E MAE 12.3 meV/atom  F MAE 234.5 meV/Å
///  812 struct/s  elapsed 4.1 s`. Flushes after each line.
class ProgressHook : public EpochReportHook {
 public:
  /// `total_epochs`: shown as "/N" when > 0. `out` must outlive the hook.
  ProgressHook(std::ostream& out, int64_t total_epochs);
  std::string name() const override { return "ProgressHook"; }

 protected:
  void report(const EpochRecord& record) override;

 private:
  std::ostream& out_;
  int64_t total_epochs_;
};

/// Writes `path` as CSV with header
/// `epoch,step,elapsed_s,train_loss,<train_loss_<term>...>,valid_energy_mae,...`
/// (validation metrics in meV/atom, meV/Å, meV/Å³; empty when not validated,
/// NaN written as empty). One row per record, flushed at once.
class MetricsCsvHook : public EpochReportHook {
 public:
  /// `loss_terms`: names of the loss components to log ("energy", "forces", ...).
  /// The file is created (truncated) by enter().
  /// `append` (a resumed run): rows are added to an existing non-empty file
  /// without a new header.
  MetricsCsvHook(std::string path, std::vector<std::string> loss_terms, bool append = false);
  std::string name() const override { return "MetricsCsvHook"; }
  /// Opens the file and writes the header (unless appending to a non-empty
  /// file). @throws DataError if it cannot be created.
  void enter() override;
  void exit(bool failed) override;
  /// Bytes written to the file so far (header included); what a checkpoint
  /// records. 0 before enter().
  uint64_t bytes_written() const { return bytes_; }
  /// Issue 15: a resumed run cuts the file to `bytes` (what the checkpoint
  /// recorded) at the next enter(), then appends: rows written after the
  /// checkpoint are not duplicated.
  void truncate_at_enter(uint64_t bytes) { truncate_to_ = bytes; }

 protected:
  /// Writes one row. @throws MetricsWriteError naming the file and the
  /// system's reason when the write fails (full disk, file-size limit).
  void report(const EpochRecord& record) override;

 private:
  std::string path_;
  std::vector<std::string> loss_terms_;
  bool append_ = false;
  void write_checked(const std::string& text);  // @throws MetricsWriteError
  std::ofstream file_;
  uint64_t bytes_ = 0;
  std::optional<uint64_t> truncate_to_;
};

/// Options of ProgressBarHook.
struct ProgressBarOptions {
  /// Whether the output is a terminal. Only then does the hook draw anything;
  /// otherwise it prints nothing at all (plain logs keep ProgressHook's lines).
  /// `crucible train` passes stdout_is_terminal(); tests force either mode.
  bool tty = false;
  /// Minimum wall time between two redraws, s (>= 0). The first and the last
  /// batch of an epoch are always drawn. Default 0.2; tests use 0.
  double min_redraw_seconds = 0.2;
  /// Width of the bar in characters (>= 1). Default 24.
  int bar_width = 24;
  /// Monotonic clock in seconds; empty = std::chrono::steady_clock. Tests may
  /// inject a fake one for reproducible rates and ETAs.
  std::function<double()> clock;
};

/// A live progress bar: one terminal line per epoch, redrawn in place with
/// '\r' (no newline until the epoch ends), e.g.
/// `epoch  2/60 [=========>          ]   41/100  12.3 batch/s  98.1 struct/s
///  ETA 0:05 (run 12:03)  loss 1.234e-02`.
///
/// Shows the epoch number (with "/N" when the total is known), a bar of the
/// batches done in this epoch out of `batches_per_epoch`, the batch and
/// structure rates of this epoch (training only, s⁻¹), the ETA of the epoch
/// and, when the total is known, of the run (assuming this epoch's batch
/// rate; validation time not included), and the running mean total training
/// loss of the epoch. The line is finished with '\n' after the last batch of
/// the epoch (AFTER_BATCH, so before any AFTER_EPOCH output of other hooks),
/// at AFTER_TRAINING when the step target ends an epoch early, and at exit().
/// At AFTER_VALIDATION an unfinished line (a step-based validation
/// mid-epoch) is erased, so register this hook BEFORE ProgressHook for the
/// validation line to start on a clean line; it is redrawn at the next batch.
///
/// When `options.tty` is false the hook runs on no stage and writes nothing.
class ProgressBarHook : public Hook {
 public:
  /// `batches_per_epoch`: loader batches per epoch (>= 1; DataLoader::size()).
  /// `total_epochs`: shown as "/N" and used for the run ETA when > 0; 0 =
  /// unknown (a step-limited run). `out` must outlive the hook.
  /// @throws std::invalid_argument if batches_per_epoch < 1, total_epochs < 0,
  ///   min_redraw_seconds < 0 or bar_width < 1.
  ProgressBarHook(std::ostream& out, int64_t batches_per_epoch, int64_t total_epochs,
                  ProgressBarOptions options = {});
  std::string name() const override { return "ProgressBarHook"; }
  /// BEFORE_EPOCH, AFTER_BATCH, AFTER_VALIDATION, AFTER_TRAINING when a TTY; none otherwise.
  bool runs_on_stage(TrainingStage stage) const override;
  void operator()(TrainContext& ctx, TrainingStage stage) override;
  /// Resets the state (a fresh line for the next epoch).
  void enter() override;
  /// Finishes an unfinished line with '\n' (so an error message starts on
  /// its own line). Never throws.
  void exit(bool failed) override;
  /// Number of times the line was drawn (for tests).
  int64_t redraws() const { return redraws_; }

 private:
  double now() const;
  void draw(bool force);
  void finish_line();
  std::ostream& out_;
  int64_t batches_per_epoch_, total_epochs_;
  ProgressBarOptions options_;
  bool line_open_ = false;      // something drawn on the current line, no '\n' yet
  bool epoch_open_ = false;     // batches of the current epoch seen
  int64_t epoch_ = 0;           // 1-based number of the epoch in progress
  int64_t done_ = 0;            // batches done in this epoch (ctx.epoch_step_count)
  int64_t seen_ = 0;            // batches this hook timed in this epoch
  int64_t structures_ = 0;      // structures in those batches
  double loss_mean_ = 0;        // running mean total loss of those batches
  int64_t loss_count_ = 0;
  double epoch_start_ = 0, last_draw_ = 0;
  size_t last_width_ = 0;       // characters of the last drawn line (for padding)
  int64_t redraws_ = 0;
};

/// True if the process's standard output is a terminal (isatty(STDOUT_FILENO)).
bool stdout_is_terminal();

/// Validation metric columns of metrics.csv, in order (without the "valid_" prefix).
const std::vector<std::string>& validation_metric_names();

}  // namespace crucible
