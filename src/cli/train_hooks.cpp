// Learning-rate schedule hook.

#include "crucible/cli/train_hooks.h"

#include "crucible/models/energy_model.h"

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace crucible {

CosineLrHook::CosineLrHook(double lr0, int64_t total_steps, double final_factor)
    : lr0_(lr0), total_steps_(total_steps), final_factor_(final_factor) {
  if (!(lr0 > 0.0)) throw std::invalid_argument("CosineLrHook: lr0 must be > 0");
  if (total_steps < 1) throw std::invalid_argument("CosineLrHook: total_steps must be >= 1");
  if (!(final_factor >= 0.0 && final_factor <= 1.0)) {
    throw std::invalid_argument("CosineLrHook: final_factor must be in [0, 1]");
  }
}

double CosineLrHook::lr_at(int64_t step) const {
  constexpr double kPi = 3.14159265358979323846;
  const double s = static_cast<double>(std::clamp<int64_t>(step, 0, total_steps_));
  const double lr_min = lr0_ * final_factor_;
  return lr_min + 0.5 * (lr0_ - lr_min) * (1.0 + std::cos(kPi * s / static_cast<double>(total_steps_)));
}

void CosineLrHook::operator()(TrainContext& ctx, TrainingStage) {
  const double lr = lr_at(ctx.step_count);
  for (torch::optim::Optimizer* opt : ctx.optimizers) {
    if (!opt) continue;
    for (auto& group : opt->param_groups()) group.options().set_lr(lr);
  }
}

}  // namespace crucible
