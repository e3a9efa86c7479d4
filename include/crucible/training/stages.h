#pragma once
// Named lifecycle stages of a training run (seed 002's TrainingStage).

#include <array>
#include <string>

namespace crucible {

/// Stages in the order a run visits them. Per batch:
/// BEFORE_BATCH → BEFORE_FORWARD → AFTER_FORWARD → BEFORE_LOSS → AFTER_LOSS →
/// BEFORE_BACKWARD → DO_BACKWARD → AFTER_BACKWARD → BEFORE_OPTIMIZER_STEP →
/// DO_OPTIMIZER_STEP → AFTER_OPTIMIZER_STEP → AFTER_BATCH. Around them:
/// SETUP (before devices/optimizers are used), BEFORE_TRAINING (first batch),
/// BEFORE_EPOCH, AFTER_EPOCH, AFTER_VALIDATION, AFTER_TRAINING.
/// DO_ stages are owned by at most one hook; without a claimant the strategy
/// itself runs backward / the optimizer step.
enum class TrainingStage {
  SETUP,
  BEFORE_TRAINING,
  BEFORE_EPOCH,
  BEFORE_BATCH,
  BEFORE_FORWARD,
  AFTER_FORWARD,
  BEFORE_LOSS,
  AFTER_LOSS,
  BEFORE_BACKWARD,
  DO_BACKWARD,
  AFTER_BACKWARD,
  BEFORE_OPTIMIZER_STEP,
  DO_OPTIMIZER_STEP,
  AFTER_OPTIMIZER_STEP,
  AFTER_BATCH,
  AFTER_EPOCH,
  AFTER_VALIDATION,
  AFTER_TRAINING,
};

/// Number of stages.
inline constexpr int kNumTrainingStages = static_cast<int>(TrainingStage::AFTER_TRAINING) + 1;

/// The stage's name as in the seeds, e.g. "BEFORE_BATCH".
const char* stage_name(TrainingStage stage);

}  // namespace crucible
