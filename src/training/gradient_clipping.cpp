#include "crucible/training/gradient_clipping.h"

#include <torch/optim/optimizer.h>

#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "crucible/common/error.h"
#include "crucible/precision/precision.h"

namespace crucible {

namespace {

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

/// The defined gradients of every optimizer's parameters, each parameter once.
std::vector<at::Tensor> collect_grads(const TrainContext& ctx) {
  std::vector<at::Tensor> grads;
  for (const auto& p : optimizer_parameters(ctx)) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

/// torch.nn.utils.clip_grad_norm_'s total norm, in float64.
double total_norm(const std::vector<at::Tensor>& grads, double norm_type) {
  if (grads.empty()) return 0.0;
  if (std::isinf(norm_type)) {
    double m = 0.0;
    for (const auto& g : grads) {
      if (g.numel() == 0) continue;
      const double v = g.detach().abs().max().to(at::kDouble).item<double>();
      if (std::isnan(v)) return v;
      m = std::max(m, v);
    }
    return m;
  }
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.detach().to(at::kDouble).norm(norm_type).reshape({1}));
  return at::cat(norms).to(at::kCPU).norm(norm_type).item<double>();
}

}  // namespace

GradientClippingHook::GradientClippingHook(GradientClippingOptions options)
    : options_(options) {
  const bool n = options_.max_norm.has_value();
  const bool v = options_.clip_value.has_value();
  if (n == v) {
    throw ConfigError(std::string("`max_norm` or `clip_value` must be set (exactly one), got ") +
                      (n ? "both" : "neither"));
  }
  if (n && !(std::isfinite(*options_.max_norm) && *options_.max_norm > 0)) {
    throw ConfigError("`max_norm` must be finite and > 0, got " + fmt(*options_.max_norm));
  }
  if (v && !(std::isfinite(*options_.clip_value) && *options_.clip_value > 0)) {
    throw ConfigError("`clip_value` must be finite and > 0, got " + fmt(*options_.clip_value));
  }
  const double t = options_.norm_type;
  if (!((std::isfinite(t) && t > 0) || (std::isinf(t) && t > 0))) {
    throw ConfigError("`norm_type` must be > 0 or inf, got " + fmt(t));
  }
}

UpdateDecision GradientClippingHook::operator()(TrainContext& ctx, TrainingStage stage,
                                                bool will_skip) {
  if (stage != TrainingStage::DO_OPTIMIZER_STEP || will_skip) return {true, ctx.loss};
  if (ctx.precision) {
    for (auto* opt : ctx.optimizers) {
      if (opt) ctx.precision->unscale_gradients(*opt);
    }
  }
  const std::vector<at::Tensor> grads = collect_grads(ctx);
  const double total = total_norm(grads, options_.norm_type);
  last_total_norm_ = total;
  ++clip_count_;
  at::NoGradGuard no_grad;
  if (options_.max_norm) {
    // As PyTorch's clamp(max=1): a NaN total norm gives a NaN factor.
    const double q = *options_.max_norm / (total + 1e-6);
    const double coef = q > 1.0 ? 1.0 : q;
    for (auto g : grads) g.mul_(coef);
  } else {
    const double c = *options_.clip_value;
    for (auto g : grads) g.clamp_(-c, c);
  }
  return {true, ctx.loss};
}

}  // namespace crucible
