#pragma once
// GradientClippingHook: clips gradients by global norm or by value right
// before the optimizer step (seed 001's priority-30 update hook family).

#include <optional>
#include <string>

#include "crucible/training/update_hook.h"

namespace crucible {

/// How GradientClippingHook clips. Exactly one of `max_norm` / `clip_value`
/// must be set.
struct GradientClippingOptions {
  /// Clip by total norm (torch.nn.utils.clip_grad_norm_): finite and > 0.
  std::optional<double> max_norm;
  /// Order of the norm: finite and > 0, or +infinity (max-abs). Default 2.
  double norm_type = 2.0;
  /// Clip by value (torch.nn.utils.clip_grad_value_): every gradient entry
  /// clamped to [-clip_value, clip_value]; finite and > 0.
  std::optional<double> clip_value;
};

/// Clips the gradients of every optimizer's parameters at DO_OPTIMIZER_STEP
/// (seed 001's ClipGrads example, priority 30).
///
/// At DO_OPTIMIZER_STEP, unless `will_skip` (an earlier hook, e.g. gradient
/// accumulation, vetoed the step, so nothing is touched):
/// 1. if `ctx.precision` is non-null, calls
///    `ctx.precision->unscale_gradients(*opt)` for every optimizer, so that
///    under 16-mixed the clipping sees the true (unscaled) gradients; the
///    scaler's step later does not unscale again;
/// 2. computes the total norm of all defined gradients of all optimizers'
///    parameters (each parameter once) as torch.nn.utils.clip_grad_norm_
///    (1.13) does: the `norm_type`-norm of the per-gradient norms
///    (max-abs for infinity), accumulated in float64;
/// 3. by norm: multiplies every gradient by
///    min(1, max_norm / (total_norm + 1e-6)) (as PyTorch, also when the
///    factor is 1; a non-finite total norm makes the gradients non-finite,
///    which spike skipping or the gradient scaler then catch);
///    by value: clamps every gradient to [-clip_value, clip_value].
/// The pre-clipping total norm is recorded (last_total_norm()). Never vetoes.
/// Other stages: nothing.
///
/// Priority update_priority::kGradientClipping (30); exclusive key
/// "gradient_clipping".
class GradientClippingHook : public TrainingUpdateHook {
 public:
  /// @throws ConfigError if not exactly one of max_norm / clip_value is set
  ///   ("`max_norm` or `clip_value` must be set (exactly one), got both" /
  ///   "... got neither"), or a value is out of range, e.g.
  ///   "`max_norm` must be finite and > 0, got -1".
  explicit GradientClippingHook(GradientClippingOptions options);

  std::string name() const override { return "GradientClippingHook"; }
  int priority() const override { return update_priority::kGradientClipping; }
  std::optional<std::string> exclusive_update_key() const override {
    return std::string("gradient_clipping");
  }
  using TrainingUpdateHook::operator();
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;

  const GradientClippingOptions& options() const { return options_; }
  /// Total gradient norm (norm_type) before clipping at the last step that
  /// was clipped; nullopt before the first one. May be inf/NaN.
  std::optional<double> last_total_norm() const { return last_total_norm_; }
  /// Number of DO_OPTIMIZER_STEP dispatches that clipped (not vetoed).
  int64_t clip_count() const { return clip_count_; }

 private:
  GradientClippingOptions options_;
  std::optional<double> last_total_norm_;
  int64_t clip_count_ = 0;
};

}  // namespace crucible
