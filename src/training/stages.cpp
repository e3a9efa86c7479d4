#include "crucible/training/stages.h"

namespace crucible {

const char* stage_name(TrainingStage stage) {
  switch (stage) {
    case TrainingStage::SETUP: return "SETUP";
    case TrainingStage::BEFORE_TRAINING: return "BEFORE_TRAINING";
    case TrainingStage::BEFORE_EPOCH: return "BEFORE_EPOCH";
    case TrainingStage::BEFORE_BATCH: return "BEFORE_BATCH";
    case TrainingStage::BEFORE_FORWARD: return "BEFORE_FORWARD";
    case TrainingStage::AFTER_FORWARD: return "AFTER_FORWARD";
    case TrainingStage::BEFORE_LOSS: return "BEFORE_LOSS";
    case TrainingStage::AFTER_LOSS: return "AFTER_LOSS";
    case TrainingStage::BEFORE_BACKWARD: return "BEFORE_BACKWARD";
    case TrainingStage::DO_BACKWARD: return "DO_BACKWARD";
    case TrainingStage::AFTER_BACKWARD: return "AFTER_BACKWARD";
    case TrainingStage::BEFORE_OPTIMIZER_STEP: return "BEFORE_OPTIMIZER_STEP";
    case TrainingStage::DO_OPTIMIZER_STEP: return "DO_OPTIMIZER_STEP";
    case TrainingStage::AFTER_OPTIMIZER_STEP: return "AFTER_OPTIMIZER_STEP";
    case TrainingStage::AFTER_BATCH: return "AFTER_BATCH";
    case TrainingStage::AFTER_EPOCH: return "AFTER_EPOCH";
    case TrainingStage::AFTER_VALIDATION: return "AFTER_VALIDATION";
    case TrainingStage::AFTER_TRAINING: return "AFTER_TRAINING";
  }
  return "UNKNOWN";
}

}  // namespace crucible
