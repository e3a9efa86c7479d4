#pragma once
// Training hooks of `crucible train` besides reporting: the learning-rate
// schedule. (Gradient clipping is the canonical GradientClippingHook,
// crucible/training/gradient_clipping.h.)

#include "crucible/training/hook.h"

#include <cstdint>
#include <string>

namespace crucible {

/// Cosine learning-rate annealing per optimizer step (NequIP's
/// CosineAnnealingLR, SGDR without restarts):
///   lr(s) = lr_min + ½ (lr0 − lr_min)(1 + cos(π s / T)),  lr_min = lr0 · final_factor,
/// for the step s = 0 … T−1 about to be taken (s = step_count, clamped to T).
/// Runs on BEFORE_OPTIMIZER_STEP and sets the lr of every parameter group of
/// every optimizer.
class CosineLrHook : public Hook {
 public:
  /// @throws std::invalid_argument if lr0 <= 0, total_steps < 1 or
  ///         final_factor not in [0, 1].
  CosineLrHook(double lr0, int64_t total_steps, double final_factor);
  std::string name() const override { return "CosineLrHook"; }
  bool runs_on_stage(TrainingStage stage) const override {
    return stage == TrainingStage::BEFORE_OPTIMIZER_STEP;
  }
  void operator()(TrainContext& ctx, TrainingStage stage) override;
  /// Learning rate for step s (s clamped to [0, T]).
  double lr_at(int64_t step) const;

 private:
  double lr0_;
  int64_t total_steps_;
  double final_factor_;
};

}  // namespace crucible
