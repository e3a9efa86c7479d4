#pragma once
// NonFiniteLossGuard: stops a run at the first non-finite loss or gradient
// instead of letting the optimizer write NaN into the weights (issue 8).

#include <cstdint>
#include <string>

#include "crucible/training/update_hook.h"

namespace crucible {

/// Update hook that refuses to apply an optimizer step after a non-finite
/// loss (NaN or ±Inf) in any batch since the last step, or with a
/// non-finite gradient, and stops the run there.
///
/// On such a step it vetoes the optimizer step (so the weights, optimizer
/// moments and schedulers stay at the last good step), zeroes the gradients
/// of every optimizer parameter (so a checkpoint holds no NaN gradient), and
/// calls TrainingStrategy::request_stop(reason). The run then ends at this
/// batch's boundary, where a CheckpointHook writes the last good state; the
/// reason names the step, epoch, batch and value.
///
/// The strategy registers it by itself unless a SpikeSkippingHook is
/// registered: spike skipping then skips such steps instead (issue 8: "a
/// non-finite loss is handled by the spike-skipping hook when configured,
/// and otherwise stops the run"). Steps vetoed earlier in the chain (gradient
/// accumulation mid-cycle, the gradient scaler's overflow skips in
/// 16-mixed) are left alone, but a non-finite loss of an accumulation
/// micro-batch is remembered until the step that would apply it.
/// Data parallel: it runs after DataParallelHook (priority 15), so every
/// worker sees the same averaged loss and gradients and stops alike.
///
/// Priority update_priority::kNonFiniteLossGuard (45, after spike skipping).
/// Stateless between runs (no checkpoint state).
class NonFiniteLossGuard : public TrainingUpdateHook {
 public:
  std::string name() const override { return "NonFiniteLossGuard"; }
  int priority() const override { return update_priority::kNonFiniteLossGuard; }
  using TrainingUpdateHook::operator();
  /// Never throws for non-finite values (it vetoes and requests a stop).
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;

  /// Why the guard stopped the run; empty if it never fired.
  const std::string& reason() const { return reason_; }

 private:
  std::string pending_;  // first non-finite loss seen since the last step
  std::string reason_;
};

}  // namespace crucible
