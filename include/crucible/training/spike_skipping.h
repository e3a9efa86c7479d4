#pragma once
// SpikeSkippingHook: vetoes optimizer steps on non-finite or spiking losses
// (seed 001's priority-40 update hook family).

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "crucible/training/update_hook.h"

namespace crucible {

/// Options of SpikeSkippingHook.
struct SpikeSkippingOptions {
  /// Spike threshold in MADs above the median: finite and > 0. Default 10.
  double k = 10.0;
  /// Number of most recent accepted losses the statistic uses: >= 1. Default 50.
  int64_t window = 50;
  /// Accepted losses needed before the statistic may veto (warm-up):
  /// >= 1 and <= window. Default 10.
  int64_t min_history = 10;
};

/// Vetoes the optimizer step of a batch whose loss or gradients look broken
/// (seed 001: spike skipping, priority 40, after clipping).
///
/// At DO_OPTIMIZER_STEP, unless `will_skip` (another hook already vetoed;
/// then nothing is recorded), the step is vetoed (proceed = false) when
///  - the loss (`ctx.loss`, detached; the un-rescaled batch loss) is NaN/inf, or
///  - the total 2-norm of the gradients of all optimizers' parameters is
///    NaN/inf. This check is left out when `ctx.precision` has a gradient
///    scaler (16-mixed): scaled gradients overflow by design and the scaler
///    skips such steps itself and must see them to back off its scale; or
///  - at least `min_history` accepted losses are known and
///    loss > median + k · MAD over the last `window` of them, where
///    MAD = median(|x - median|), floored at 1e-8 · max(1, |median|) so a
///    perfectly flat history does not reject every loss above it by rounding.
/// Each veto increments skipped_steps(). A loss that passes is "pending" and
/// enters the history at AFTER_OPTIMIZER_STEP only if the step actually ran
/// (will_skip false there): vetoed or scaler-skipped losses never do.
/// Under gradient accumulation only the last micro-batch of a group reaches
/// the check (the others are vetoed by accumulation).
///
/// Priority update_priority::kSpikeSkipping (40); exclusive key "spike_skipping".
class SpikeSkippingHook : public TrainingUpdateHook {
 public:
  /// @throws ConfigError "`k` must be finite and > 0, got <v>",
  ///   "`window` must be >= 1, got <n>", "`min_history` must be in [1, window], got <n>".
  explicit SpikeSkippingHook(SpikeSkippingOptions options = {});

  std::string name() const override { return "SpikeSkippingHook"; }
  int priority() const override { return update_priority::kSpikeSkipping; }
  std::optional<std::string> exclusive_update_key() const override {
    return std::string("spike_skipping");
  }
  using TrainingUpdateHook::operator();
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;

  const SpikeSkippingOptions& options() const { return options_; }
  /// Steps this hook vetoed so far.
  int64_t skipped_steps() const { return skipped_steps_; }
  /// Checkpoint state: the loss history window (float64 [n]), the pending
  /// loss ([0] or [1]) and the skip count (int64 scalar).
  std::map<std::string, at::Tensor> hook_state() const override;
  /// @throws std::invalid_argument if an entry is missing.
  void load_hook_state(const std::map<std::string, at::Tensor>& state) override;
  /// Why the last veto happened ("non-finite loss", "non-finite gradient
  /// norm", "loss spike"); empty before the first.
  const std::string& last_skip_reason() const { return last_skip_reason_; }
  /// The accepted losses the statistic uses, oldest first (at most `window`).
  const std::deque<double>& history() const { return history_; }
  /// The current veto threshold median + k·MAD, or nullopt during warm-up.
  std::optional<double> threshold() const;

 private:
  SpikeSkippingOptions options_;
  std::deque<double> history_;
  std::optional<double> pending_;
  int64_t skipped_steps_ = 0;
  std::string last_skip_reason_;
};

}  // namespace crucible
