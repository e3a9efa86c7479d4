#pragma once
// Per-epoch reporting hooks of `crucible train`: a progress line on stdout and
// a metrics.csv file.

#include "crucible/training/hook.h"
#include "crucible/training/metrics.h"

#include <chrono>
#include <cstdint>
#include <fstream>
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
  MetricsCsvHook(std::string path, std::vector<std::string> loss_terms);
  std::string name() const override { return "MetricsCsvHook"; }
  /// Opens the file and writes the header. @throws DataError if it cannot be created.
  void enter() override;
  void exit(bool failed) override;

 protected:
  void report(const EpochRecord& record) override;

 private:
  std::string path_;
  std::vector<std::string> loss_terms_;
  std::ofstream file_;
};

/// Validation metric columns of metrics.csv, in order (without the "valid_" prefix).
const std::vector<std::string>& validation_metric_names();

}  // namespace crucible
