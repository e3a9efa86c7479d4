// NonFiniteLossGuard. See include/crucible/training/non_finite_loss.h.

#include "crucible/training/non_finite_loss.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "crucible/training/strategy.h"

namespace crucible {
namespace {

std::string where(const TrainContext& ctx) {
  return fmt::format("step {}, epoch {}, batch {} of the epoch", ctx.step_count, ctx.epoch_count,
                     ctx.epoch_step_count + 1);
}

// True when every gradient entry of the optimizers' parameters is finite.
// One sum per parameter: NaN and Inf propagate into it.
bool gradients_finite(TrainContext& ctx) {
  std::vector<at::Tensor> sums;
  for (const at::Tensor& p : optimizer_parameters(ctx)) {
    if (p.grad().defined()) sums.push_back(p.grad().detach().sum().to(at::kDouble));
  }
  if (sums.empty()) return true;
  return at::stack(sums).isfinite().all().item<bool>();
}

}  // namespace

UpdateDecision NonFiniteLossGuard::operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) {
  if (stage != TrainingStage::DO_OPTIMIZER_STEP) return {true, ctx.loss};
  if (ctx.loss.defined() && pending_.empty()) {
    const double loss = ctx.loss.detach().to(at::kDouble).sum().item<double>();
    if (!std::isfinite(loss)) pending_ = fmt::format("non-finite loss ({}) at {}", loss, where(ctx));
  }
  if (will_skip) return {true, ctx.loss};  // an earlier hook keeps this step from running
  std::string reason = pending_;
  if (reason.empty() && !gradients_finite(ctx)) {
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
