#pragma once
// BestModelHook: keeps the weights of the best validation and stops a run
// that no longer improves (MACE's checkpoint of the lowest validation loss
// and its --patience; NequIP's best_model.pth).

#include "crucible/training/hook.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>

namespace torch::nn {
class Module;
}

namespace crucible {

/// Options of BestModelHook.
struct BestModelOptions {
  /// Validation monitor to minimise (crucible/training/metrics.h
  /// validation_monitor_names(): "loss", "energy_mae", "val/forces_mae", ...).
  std::string monitor = "loss";
  /// Validations in a row without improvement after which the run finishes
  /// (TrainingStrategy::request_finish); 0 = never.
  int64_t patience = 0;
  /// The first validation with ctx.epoch_count >= this forgets the best so
  /// far (MACE at stage two: the loss weights change, so losses before and
  /// after are not comparable, and the model kept is the best of stage two).
  std::optional<int64_t> restart_at_epoch;
};

/// At AFTER_VALIDATION, with v = validation_monitor_value(*ctx.validation,
/// monitor): if v < best (strictly; NaN never improves), best = v and the
/// validated model's parameters and buffers are copied (detached CPU clones)
/// -- the published inference model (EMA) when the validation used it, else
/// ctx.model; otherwise the count of validations without improvement grows,
/// and reaching `patience` calls ctx.strategy->request_finish(reason).
/// State (best value, epoch, step, counts, weights) is checkpointed through
/// hook_state(). Never vetoes.
class BestModelHook : public Hook {
 public:
  /// @throws ConfigError naming a monitor that is not a validation monitor,
  ///   a negative patience or restart epoch.
  explicit BestModelHook(BestModelOptions options = {});
  std::string name() const override { return "BestModelHook"; }
  bool runs_on_stage(TrainingStage stage) const override {
    return stage == TrainingStage::AFTER_VALIDATION;
  }
  void operator()(TrainContext& ctx, TrainingStage stage) override;

  /// True once a validation improved on the best (weights are held).
  bool has_best() const { return !weights_.empty(); }
  /// The best monitored value (+inf before the first improvement).
  double best() const { return best_; }
  /// Epochs completed / optimizer steps at the best validation (-1 before).
  int64_t best_epoch() const { return best_epoch_; }
  int64_t best_step() const { return best_step_; }
  /// Validations since the last improvement.
  int64_t num_bad_validations() const { return num_bad_; }
  const BestModelOptions& options() const { return options_; }
  /// Copies the best weights into `module` (same parameter and buffer
  /// names and shapes; values are cast to each tensor's dtype and device).
  /// @throws std::logic_error before the first improvement;
  ///   std::invalid_argument naming a tensor the module lacks or whose
  ///   shape differs.
  void copy_best_into(torch::nn::Module& module) const;

  std::map<std::string, at::Tensor> hook_state() const override;
  /// @throws std::invalid_argument naming a missing entry.
  void load_hook_state(const std::map<std::string, at::Tensor>& state) override;

 private:
  BestModelOptions options_;
  double best_ = std::numeric_limits<double>::infinity();
  int64_t best_epoch_ = -1;
  int64_t best_step_ = -1;
  int64_t num_bad_ = 0;
  bool restarted_ = false;
  std::map<std::string, at::Tensor> weights_;  ///< "param.<name>" / "buffer.<name>"
};

}  // namespace crucible
