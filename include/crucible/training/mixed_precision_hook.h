#pragma once
// MixedPrecisionHook: the precision policy of a training run as an update
// hook (seed 000's MixedPrecisionHook, on top of seed 004's precision
// plugin and seed 001's scaler-aware stepping).

#include "crucible/precision/precision.h"
#include "crucible/training/update_hook.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace crucible {

/// Drives autocast and, under 16-mixed, the gradient scaler of a run
/// (seed 000). A TrainingUpdateHook with priority 20
/// (update_priority::kMixedPrecision) and exclusive key "mixed_precision":
/// an orchestrator (hence a strategy) holds at most one, a second is a
/// ConfigError.
///
/// Per batch, inside the orchestrator:
/// - BEFORE_BATCH: enters the forward autocast region of its plugin
///   (PrecisionPlugin::forward_context on the device of the first model
///   parameter, else CPU); sets `ctx.precision`. The forward, forces, stress
///   and losses are computed inside the region (models keep geometry and
///   derivatives in float32 / float64, see compute_outputs and SchNet).
/// - DO_BACKWARD: leaves the region before backward(); under 16-mixed
///   returns the loss scaled by the plugin's GradScaler (built lazily by
///   PrecisionPlugin::pre_backward); other modes return the loss unchanged.
/// - DO_OPTIMIZER_STEP: if the step is not vetoed (`will_skip` false) and a
///   scaler is active, unscales every optimizer's gradients (once; a hook
///   that already unscaled through ctx.precision is not unscaled twice); on a
///   vetoed step nothing is unscaled, so accumulated gradients stay scaled.
///   With an active scaler the hook owns the step (owns_optimizer_step):
///   step_optimizers() steps each optimizer through the scaler, which skips
///   a step whose gradients hold inf/NaN, then updates the scale (halved
///   after an inf/NaN step with the default options).
/// - AFTER_OPTIMIZER_STEP / exit(): leaves the region if still inside (also
///   when the run ends with an exception).
///
/// Precision modes (parse_precision aliases): "32-true"/"fp32": no autocast,
/// no scaler (a no-op besides taking part in the orchestrated update);
/// "bf16-mixed"/"bf16": bfloat16 autocast, no scaler; "16-mixed"/"fp16":
/// float16 autocast where the backend has it (not CPU on LibTorch 1.13: the
/// forward stays float32, the plugin warns once) plus the scaler;
/// "64-true", "bf16-true", "16-true": accepted, no autocast and no scaler
/// (the strategy converts the model and batches; see StrategyOptions::precision).
class MixedPrecisionHook : public TrainingUpdateHook {
 public:
  /// @param precision a mode or alias (parse_precision).
  /// @param scaler_options options of the 16-mixed GradScaler.
  /// @throws ConfigError for an unknown mode or invalid scaler options.
  explicit MixedPrecisionHook(const std::string& precision,
                              GradScalerOptions scaler_options = {});
  /// Seed 000's dtype form: float32, bfloat16, float16 (or float64) →
  /// precision_from_dtype. @throws ConfigError for another dtype.
  explicit MixedPrecisionHook(at::ScalarType dtype, GradScalerOptions scaler_options = {});
  /// Drives `plugin` (a user's own PrecisionPlugin subclass, or the
  /// strategy's: TrainingStrategy shares its plugin with the hook it
  /// registers). @throws ConfigError if `plugin` is null.
  explicit MixedPrecisionHook(std::shared_ptr<PrecisionPlugin> plugin);
  ~MixedPrecisionHook() override;

  std::string name() const override { return "MixedPrecisionHook(" + plugin_->name() + ")"; }
  int priority() const override { return update_priority::kMixedPrecision; }
  /// "mixed_precision": one per strategy (seed 000).
  std::optional<std::string> exclusive_update_key() const override { return "mixed_precision"; }
  using TrainingUpdateHook::operator();
  /// See the class comment for per-stage behaviour.
  /// @throws std::logic_error if ctx.loss is undefined at DO_BACKWARD.
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;
  /// True while a gradient scaler is active (16-mixed, from the first
  /// DO_BACKWARD on). Under other modes the orchestrator steps as usual.
  bool owns_optimizer_step() const override;
  /// Steps every optimizer of ctx.optimizers through the scaler, then
  /// updates the scale once; skipped[i] is true where inf/NaN gradients made
  /// the scaler skip optimizer i. Without a scaler: plain steps.
  /// @throws std::logic_error from GradScaler (e.g. no gradients at all).
  OptimizerStepReport step_optimizers(TrainContext& ctx) override;
  /// Leaves the autocast region if it is still open (seed 000's __exit__);
  /// the scaler state is kept (unlike seed 000, which drops it: here the
  /// state is checkpointed through state_dict()).
  void exit(bool failed) override;

  /// The autocast region for validation / inference on `device`
  /// (seed 000 inference_autocast): active for bf16-mixed (and 16-mixed where
  /// supported), an inactive guard otherwise. Never touches the scaler.
  std::unique_ptr<AutocastGuard> inference_context(at::Device device) const;

  /// The plugin (mode, dtypes, scaler). Never null.
  PrecisionPlugin& plugin() { return *plugin_; }
  /// The plugin object given to the plugin constructor, or null for a hook
  /// built from a mode or dtype (which only drives the autocast region and
  /// the scaler). A strategy without a plugin of its own adopts a given
  /// one: it converts the models, batches and outputs with it (seed 004).
  std::shared_ptr<PrecisionPlugin> given_plugin() const { return given_plugin_ ? plugin_ : nullptr; }
  const PrecisionPlugin& plugin() const { return *plugin_; }
  PrecisionMode mode() const { return plugin_->mode(); }
  /// The 16-mixed scaler, or null (other modes, or before the first DO_BACKWARD).
  GradScaler* scaler() { return plugin_->scaler(); }
  /// Current loss scale: the scaler's, or the one a torn-down scaler left
  /// (PrecisionPlugin::teardown keeps it); 1.0 without either.
  double scale() const;
  /// True while inside an active training autocast region (false for modes
  /// without autocast and for 16-mixed where the backend has no float16 autocast).
  bool in_autocast_region() const { return region_ && region_->active(); }

  /// Scaler state (GradScaler::state_dict keys); empty without a scaler.
  std::map<std::string, double> state_dict() const { return plugin_->state_dict(); }
  /// Restores a state_dict(), also before the scaler exists (applied when it
  /// is built). No-op outside 16-mixed.
  /// @throws std::invalid_argument as PrecisionPlugin::load_state_dict.
  /// Checkpoint state: the scaler's state_dict() as float64 scalars.
  std::map<std::string, at::Tensor> hook_state() const override;
  /// @throws std::invalid_argument as load_state_dict.
  void load_hook_state(const std::map<std::string, at::Tensor>& state) override;
  void load_state_dict(const std::map<std::string, double>& state) {
    plugin_->load_state_dict(state);
  }

 private:
  void leave_region();

  std::shared_ptr<PrecisionPlugin> plugin_;
  bool given_plugin_ = false;  ///< plugin_ came from the plugin constructor
  std::unique_ptr<AutocastGuard> region_;
};

}  // namespace crucible
