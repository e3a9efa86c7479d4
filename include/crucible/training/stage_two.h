#pragma once
// StageTwoHook: the learning-rate half of MACE's "stage two" (its SWA
// stage; Batatia et al., NeurIPS 2022, and mace/tools/train.py): from a
// chosen epoch on, the learning rate is held at a lower value and the main
// schedule stops. The loss half (energy weight raised) is a step loss-weight
// schedule at the same epoch (losses/loss_weight_schedule.h); the config
// layer builds both from training.stage_two.

#include "crucible/training/hook.h"

#include <cstdint>
#include <string>

namespace crucible {

/// Options of StageTwoHook.
struct StageTwoOptions {
  /// First epoch (0-based: epochs completed before it) trained in stage
  /// two, >= 0.
  int64_t start_epoch = 0;
  /// Learning rate of every param group in stage two, > 0 (MACE swa_lr,
  /// default 1e-3).
  double lr = 1e-3;
};

/// At BEFORE_EPOCH, once ctx.epoch_count >= start_epoch: every scheduler in
/// ctx.lr_schedulers is held at `lr` (LrScheduler::hold: it keeps counting
/// but no longer changes the lr; a plateau schedule stops reading its
/// metric), and every optimizer without a scheduler gets lr on each param
/// group. MACE's SWALR with anneal_epochs=1 makes the same jump at the
/// first stage-two epoch. Idempotent, stateless (the held lr is in the
/// scheduler's checkpointed state). Never vetoes.
class StageTwoHook : public Hook {
 public:
  /// @throws ConfigError "`start_epoch` must be >= 0, got <n>" or
  ///   "`lr` must be finite and > 0, got <v>".
  explicit StageTwoHook(StageTwoOptions options);
  std::string name() const override { return "StageTwoHook"; }
  bool runs_on_stage(TrainingStage stage) const override {
    return stage == TrainingStage::BEFORE_EPOCH;
  }
  void operator()(TrainContext& ctx, TrainingStage stage) override;
  const StageTwoOptions& options() const { return options_; }

 private:
  StageTwoOptions options_;
};

}  // namespace crucible
