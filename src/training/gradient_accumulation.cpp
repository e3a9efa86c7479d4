#include "crucible/training/gradient_accumulation.h"

#include "crucible/common/error.h"

namespace crucible {

GradientAccumulationHook::GradientAccumulationHook(int64_t steps) : steps_(steps) {
  if (steps_ < 1) {
    throw ConfigError("`gradient_accumulation_steps` must be >= 1, got " + std::to_string(steps_));
  }
}

UpdateDecision GradientAccumulationHook::operator()(TrainContext& ctx, TrainingStage stage,
                                                    bool will_skip) {
  (void)will_skip;
  if (steps_ == 1) return {true, ctx.loss};
  const int64_t pos = ((ctx.batch_count % steps_) + steps_) % steps_;
  switch (stage) {
    case TrainingStage::BEFORE_BATCH:
      return {pos == 0, ctx.loss};
    case TrainingStage::DO_BACKWARD:
      return {true, ctx.loss / static_cast<double>(steps_)};
    case TrainingStage::DO_OPTIMIZER_STEP:
      return {pos == steps_ - 1, ctx.loss};
    default:
      return {true, ctx.loss};
  }
}

}  // namespace crucible
