#pragma once
// NonFiniteLossGuard: stops a run at the first non-finite loss or gradient
// instead of letting the optimizer write NaN into the weights (issue 8).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "crucible/training/update_hook.h"

namespace crucible {

/// True when every entry of every defined tensor is finite (no NaN, ±Inf);
/// undefined tensors are skipped. Contiguous CPU float32/float64 tensors are
/// read in place, one pass over their bit patterns (an exponent of all ones
/// is NaN or Inf, IEEE 754); other tensors take one sum each, cast to
/// float64 (NaN and Inf propagate into a sum; a sum that overflows reads as
/// non-finite). Used by NonFiniteLossGuard on the optimizers' gradients,
/// where a sum, a cast and a stack per parameter were ~170 dispatched ops
/// per SchNet step. Any shapes, dtypes and devices. Throws nothing of its own.
bool all_finite(const std::vector<at::Tensor>& tensors);

/// Options of NonFiniteLossGuard.
struct NonFiniteLossGuardOptions {
  /// Floor of the gradient scaler's loss scale (16-mixed). Overflowing
  /// steps are the scaler's to skip (each halves the scale by default); once
  /// consecutive overflows have pushed the scale below this floor the
  /// gradients are inf/NaN at any scale and the guard stops the run.
  /// 1e-4 is fairseq's `--min-loss-scale` default (Ott et al., 2019,
  /// fairseq/optim/dynamic_loss_scaler.py). Finite and > 0.
  double min_loss_scale = 1e-4;
};

/// Update hook that refuses to apply an optimizer step after a non-finite
/// loss (NaN or ±Inf) in any batch since the last step, or with a
/// non-finite gradient when no gradient scaler is active, and stops the run
/// there.
///
/// With an active, enabled gradient scaler (16-mixed; ctx.precision's
/// scaler) non-finite gradients are an overflow: the guard lets the scaler
/// skip that step and back off the scale, and training goes on (seed 000;
/// seed 001 holds only the schedulers of the skipped optimizers). It stops
/// the run only when the scale has fallen below
/// NonFiniteLossGuardOptions::min_loss_scale after consecutive overflows
/// (the reason names the count, the scale and the floor). A non-finite
/// loss stops the run with or without a scaler.
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
/// State: the count of consecutive overflows (not checkpointed: a resumed
/// run counts again from 0, and the scale itself is in the scaler's state).
class NonFiniteLossGuard : public TrainingUpdateHook {
 public:
  /// @throws ConfigError if options.min_loss_scale is not finite and > 0.
  explicit NonFiniteLossGuard(NonFiniteLossGuardOptions options = {});
  std::string name() const override { return "NonFiniteLossGuard"; }
  int priority() const override { return update_priority::kNonFiniteLossGuard; }
  using TrainingUpdateHook::operator();
  /// Never throws for non-finite values (it vetoes and requests a stop).
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;

  /// Why the guard stopped the run; empty if it never fired.
  const std::string& reason() const { return reason_; }
  /// Scaler overflows in a row up to the last step (0 after a step that ran).
  int64_t consecutive_overflows() const { return consecutive_overflows_; }
  const NonFiniteLossGuardOptions& options() const { return options_; }

 private:
  NonFiniteLossGuardOptions options_;
  double scale_before_step_ = 0.0;  // the scaler's scale at DO_OPTIMIZER_STEP; 0 = no scaler
  int64_t consecutive_overflows_ = 0;
  std::string pending_;  // first non-finite loss seen since the last step
  std::string reason_;
};

}  // namespace crucible
