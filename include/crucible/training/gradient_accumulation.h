#pragma once
// GradientAccumulationHook: sums the gradients of k consecutive batches
// before one optimizer step (seed 001's priority-10 update hook family).

#include <cstdint>
#include <optional>
#include <string>

#include "crucible/training/update_hook.h"

namespace crucible {

/// Accumulates gradients over groups of `steps` consecutive batches
/// (seed 001: gradient accumulation is the canonical priority-10 hook that
/// vetoes zero_grad and the optimizer step on non-boundary micro-batches).
///
/// The position of a batch in its group is `ctx.batch_count % steps`
/// (batch_count counts every processed batch, skipped steps included, so the
/// grouping survives a restart from a checkpoint). Per stage:
/// - BEFORE_BATCH: vetoes zero_grad unless the batch is the first of its group.
/// - DO_BACKWARD: returns `ctx.loss / steps`, so the accumulated gradient is
///   the gradient of the mean loss over the group (exactly the gradient of
///   one big batch when the loss is a mean over equally sized micro-batches).
/// - DO_OPTIMIZER_STEP: vetoes the step unless the batch is the last of its
///   group. Later hooks (clipping, spike skipping) then see will_skip = true.
/// - SETUP, AFTER_OPTIMIZER_STEP: nothing.
/// With steps == 1 the hook never vetoes and leaves the loss unchanged.
///
/// Note: TrainingStrategy's step_count counts optimizer steps, so a run of
/// num_steps = n consumes n × steps batches.
///
/// Priority update_priority::kGradientAccumulation (10); exclusive key
/// "gradient_accumulation".
class GradientAccumulationHook : public TrainingUpdateHook {
 public:
  /// @throws ConfigError "`gradient_accumulation_steps` must be >= 1, got <n>".
  explicit GradientAccumulationHook(int64_t steps);

  std::string name() const override { return "GradientAccumulationHook"; }
  int priority() const override { return update_priority::kGradientAccumulation; }
  std::optional<std::string> exclusive_update_key() const override {
    return std::string("gradient_accumulation");
  }
  using TrainingUpdateHook::operator();
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;

  /// Number of batches per optimizer step.
  int64_t steps() const { return steps_; }

 private:
  int64_t steps_;
};

}  // namespace crucible
