#pragma once
// metrics.jsonl: one JSON object per logged training step and per validation,
// and the learning-curve picture drawn from the same data.

#include "crucible/report/learning_curve.h"
#include "crucible/training/hook.h"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// Issue 47: brings a metrics file of a resumed run back to the `bytes` a
/// checkpoint recorded, never padding it. A longer file is cut to `bytes`
/// (rows after the checkpoint go); a shorter one (edited or cut by hand) is
/// cut to its last complete line, and a missing one is left to be started
/// anew, each with a one-line warning on stderr naming the file and the
/// bytes that differ. @throws DataError naming the file when it cannot be cut.
void cut_back_to_checkpoint(const std::string& path, uint64_t bytes);

/// Options of MetricsJsonlHook.
struct MetricsJsonlOptions {
  /// Log a training line every n optimizer steps (>= 1): at steps 1, 1+n,
  /// 1+2n, ... so a run of S steps logs ceil(S / n) lines. Default 10.
  int64_t log_every_n_steps = 10;
  /// Where exit() writes the learning curve (see write_learning_curve_svg);
  /// empty = no picture. Default empty.
  std::string learning_curve_path;
  /// A resumed run: lines are appended to an existing file, and the
  /// learning curve starts from the lines already there. Default false.
  bool append = false;
};

/// Writes `path` as JSON lines, one object per line, flushed after each:
///
/// - `{"type":"train","step":S,"epoch":E,"batch":B,"loss":L,"loss_<term>":...,
///    "lr":..., "elapsed_s":T}` at AFTER_BATCH of every batch whose optimizer
///   step ran (ctx.optimizer_step_skipped false: batches vetoed by spike
///   skipping or waiting for gradient accumulation are not logged) and whose
///   step count S (after the step) satisfies (S - 1) % log_every_n_steps == 0.
///   E is the 1-based epoch in progress, B the batches done in it (1-based
///   index of this batch), L the batch's total (weighted) loss, `loss_<term>`
///   each unweighted loss component ("loss_energy", "loss_forces", ...).
///   "lr" is the learning rate of the first parameter group of the optimizer
///   as used by this step (read at BEFORE_OPTIMIZER_STEP, before a per-step
///   scheduler advances it); with several optimizers "lr_0", "lr_1", ...
///   T is the wall time since enter(), s.
/// - `{"type":"validation","step":S,"epoch":E,"energy_mae":...,...,
///    "num_structures":N,"num_energies":...,"num_forces":...,
///    "num_stresses":...,"inference_model":bool,"final":bool,"elapsed_s":T}`
///   at every AFTER_VALIDATION, with every metric of
///   ValidationSummary::as_map() (meV/atom, meV/Å, meV/Å³). E is the number
///   of completed epochs; "final" is true for the validation after training,
///   which is written only when it differs from the last line (another step
///   or other figures, e.g. EMA weights); a repeat of the last line is not.
///
/// Non-finite numbers (NaN metrics without labels, a diverged loss) are
/// written as null. Only rank 0 (ctx.global_rank == 0) writes.
///
/// The hook also keeps the learning-curve data (curve()); exit() writes the
/// picture to options.learning_curve_path when it is set: always after a
/// successful run, after a failed one only if there is data. A picture that
/// cannot be written never fails the run: exit() stores the message in
/// curve_error() instead of throwing.
class MetricsJsonlHook : public Hook {
 public:
  /// @throws std::invalid_argument if options.log_every_n_steps < 1.
  explicit MetricsJsonlHook(std::string path, MetricsJsonlOptions options = {});
  std::string name() const override { return "MetricsJsonlHook"; }
  /// BEFORE_OPTIMIZER_STEP, AFTER_BATCH, AFTER_TRAINING, AFTER_VALIDATION.
  bool runs_on_stage(TrainingStage stage) const override;
  void operator()(TrainContext& ctx, TrainingStage stage) override;
  /// Creates (truncates) the file and clears the curve.
  /// @throws DataError naming the path if the file cannot be created.
  void enter() override;
  /// Closes the file and writes the learning curve (see the class comment).
  /// Never throws.
  void exit(bool failed) override;

  /// The data logged so far (train lines and validations).
  const LearningCurve& curve() const { return curve_; }
  /// Lines written so far (train and validation).
  int64_t lines_written() const { return lines_; }
  /// Bytes in the file so far (what a checkpoint records); 0 before enter().
  uint64_t bytes_written() const { return bytes_; }
  /// Issue 15: a resumed run cuts the file to `bytes` (what the checkpoint
  /// recorded) at the next enter(), then appends (no duplicated or torn lines).
  void truncate_at_enter(uint64_t bytes) { truncate_to_ = bytes; }
  /// Empty, or why the last learning-curve write in exit() failed.
  const std::string& curve_error() const { return curve_error_; }
  const std::string& path() const { return path_; }

 private:
  void write_line(const std::string& line);
  std::string path_;
  MetricsJsonlOptions options_;
  std::ofstream file_;
  std::chrono::steady_clock::time_point start_;
  std::vector<double> step_lrs_;  // lr of each optimizer at BEFORE_OPTIMIZER_STEP
  bool training_done_ = false;    // AFTER_TRAINING seen: the next validation is final
  int64_t lines_ = 0;
  uint64_t bytes_ = 0;
  std::optional<uint64_t> truncate_to_;
  LearningCurve curve_;
  std::string curve_error_;
};

}  // namespace crucible
