#include "crucible/training/stage_two.h"

#include "crucible/common/error.h"
#include "crucible/training/lr_scheduler.h"

#include <torch/optim/optimizer.h>

#include <cmath>
#include <sstream>

namespace crucible {

StageTwoHook::StageTwoHook(StageTwoOptions options) : options_(options) {
  if (options_.start_epoch < 0) {
    throw ConfigError("`start_epoch` must be >= 0, got " + std::to_string(options_.start_epoch));
  }
  if (!(options_.lr > 0.0) || !std::isfinite(options_.lr)) {
    std::ostringstream v;
    v << options_.lr;
    throw ConfigError("`lr` must be finite and > 0, got " + v.str());
  }
}

void StageTwoHook::operator()(TrainContext& ctx, TrainingStage stage) {
  if (stage != TrainingStage::BEFORE_EPOCH || ctx.epoch_count < options_.start_epoch) return;
  for (size_t i = 0; i < ctx.optimizers.size(); ++i) {
    LrScheduler* scheduler = i < ctx.lr_schedulers.size() ? ctx.lr_schedulers[i] : nullptr;
    if (scheduler) {
      scheduler->hold(options_.lr);
    } else if (ctx.optimizers[i]) {
      for (auto& group : ctx.optimizers[i]->param_groups()) group.options().set_lr(options_.lr);
    }
  }
}

}  // namespace crucible
