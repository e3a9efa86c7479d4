// NonFiniteLossGuard. See include/crucible/training/non_finite_loss.h.

#include "crucible/training/non_finite_loss.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "crucible/common/error.h"
#include "crucible/precision/precision.h"
#include "crucible/training/strategy.h"
#include "../simd_clones.h"

namespace crucible {
namespace {

std::string where(const TrainContext& ctx) {
  return fmt::format("step {}, epoch {}, batch {} of the epoch", ctx.step_count, ctx.epoch_count,
                     ctx.epoch_step_count + 1);
}

// Whether no value has an exponent of all ones (NaN or Inf): an OR over
// the values' bit patterns, which the compiler vectorises (an early-exit
// std::isfinite loop it does not); built for AVX-512, AVX2 and the baseline.
template <class Bits>
inline bool exponents_finite(const Bits* v, int64_t n, Bits exponent) {
  Bits all_ones_seen = 0;
  for (int64_t i = 0; i < n; ++i) all_ones_seen |= static_cast<Bits>((v[i] & exponent) == exponent);
  return all_ones_seen == 0;
}
CRUCIBLE_SIMD_CLONES bool floats_finite(const uint32_t* v, int64_t n) {
  return exponents_finite<uint32_t>(v, n, 0x7f800000u);
}
CRUCIBLE_SIMD_CLONES bool doubles_finite(const uint64_t* v, int64_t n) {
  return exponents_finite<uint64_t>(v, n, 0x7ff0000000000000ull);
}

// True when every gradient entry of the optimizers' parameters is finite.
bool gradients_finite(TrainContext& ctx) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : optimizer_parameters(ctx)) grads.push_back(p.grad());
  return all_finite(grads);
}

// The run's active, enabled gradient scaler (16-mixed), or null.
GradScaler* active_scaler(const TrainContext& ctx) {
  if (!ctx.precision) return nullptr;
  GradScaler* s = ctx.precision->scaler();
  return s && s->is_enabled() ? s : nullptr;
}

}  // namespace

bool all_finite(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> sums;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (t.is_cpu() && t.is_contiguous() && t.scalar_type() == at::kFloat) {
      if (!floats_finite(static_cast<const uint32_t*>(t.data_ptr()), t.numel())) return false;
    } else if (t.is_cpu() && t.is_contiguous() && t.scalar_type() == at::kDouble) {
      if (!doubles_finite(static_cast<const uint64_t*>(t.data_ptr()), t.numel())) return false;
    } else {
      sums.push_back(t.detach().sum().to(at::kDouble));
    }
  }
  if (sums.empty()) return true;
  return at::stack(sums).isfinite().all().item<bool>();
}

NonFiniteLossGuard::NonFiniteLossGuard(NonFiniteLossGuardOptions options) : options_(options) {
  if (!(options_.min_loss_scale > 0.0) || !std::isfinite(options_.min_loss_scale)) {
    throw ConfigError(fmt::format("NonFiniteLossGuard min_loss_scale must be finite and > 0, got {}",
                                  options_.min_loss_scale));
  }
}

UpdateDecision NonFiniteLossGuard::operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) {
  if (stage == TrainingStage::AFTER_OPTIMIZER_STEP) {
    GradScaler* scaler = active_scaler(ctx);
    if (!scaler || scale_before_step_ <= 0.0) return {true, ctx.loss};
    const double scale = scaler->get_scale();
    const bool overflow = will_skip && scale < scale_before_step_;
    scale_before_step_ = 0.0;
    if (!will_skip) consecutive_overflows_ = 0;
    if (!overflow) return {true, ctx.loss};
    ++consecutive_overflows_;
    if (scale < options_.min_loss_scale) {
      const std::string reason = fmt::format(
          "gradient scaler overflowed {} times in a row: the loss scale fell to {:g}, below the "
          "floor min_loss_scale = {:g}, at {}; the gradients are inf/NaN at any scale (lower the "
          "learning rate, or train in bf16-mixed or 32-true)",
          consecutive_overflows_, scale, options_.min_loss_scale, where(ctx));
      if (reason_.empty()) reason_ = reason;
      if (ctx.strategy) ctx.strategy->request_stop(reason);
    }
    return {true, ctx.loss};
  }
  if (stage != TrainingStage::DO_OPTIMIZER_STEP) return {true, ctx.loss};
  if (ctx.loss.defined() && pending_.empty()) {
    const double loss = ctx.loss.detach().to(at::kDouble).sum().item<double>();
    // A NaN prints as "nan" whatever its sign bit (x86's default NaN is "-nan").
    if (!std::isfinite(loss))
      pending_ = fmt::format("non-finite loss ({}) at {}", std::isnan(loss) ? "nan" : fmt::format("{}", loss), where(ctx));
  }
  if (will_skip) return {true, ctx.loss};  // an earlier hook keeps this step from running
  GradScaler* scaler = active_scaler(ctx);
  // With a scaler, non-finite gradients are an overflow the scaler skips.
  scale_before_step_ = scaler ? scaler->get_scale() : 0.0;
  std::string reason = pending_;
  if (reason.empty() && !scaler && !gradients_finite(ctx)) {
    reason = "non-finite gradient at " + where(ctx);
  }
  pending_.clear();
  if (reason.empty()) return {true, ctx.loss};

  at::NoGradGuard no_grad;
  for (const at::Tensor& p : optimizer_parameters(ctx)) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  if (reason_.empty()) reason_ = reason;
  if (ctx.strategy) ctx.strategy->request_stop(reason);
  return {false, ctx.loss};
}

}  // namespace crucible
