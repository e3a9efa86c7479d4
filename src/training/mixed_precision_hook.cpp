// MixedPrecisionHook (seed 000 semantics; seed 001 scaler-aware stepping).

#include "crucible/training/mixed_precision_hook.h"

#include "crucible/common/error.h"
#include "crucible/models/energy_model.h"

#include <torch/optim/optimizer.h>

#include <stdexcept>

namespace crucible {

namespace {

/// Device of the model's first parameter (seed 000 uses the workflow's
/// primary device); CPU if there is no model or parameter.
at::Device model_device(const TrainContext& ctx) {
  if (ctx.model) {
    for (const auto& p : ctx.model->module().parameters()) return p.device();
  }
  return at::Device(at::kCPU);
}

}  // namespace

MixedPrecisionHook::MixedPrecisionHook(const std::string& precision,
                                       GradScalerOptions scaler_options)
    : plugin_(make_precision_plugin(precision, scaler_options)) {}

MixedPrecisionHook::MixedPrecisionHook(at::ScalarType dtype, GradScalerOptions scaler_options)
    : plugin_(std::make_shared<PrecisionPlugin>(precision_from_dtype(dtype), scaler_options)) {}

MixedPrecisionHook::MixedPrecisionHook(std::shared_ptr<PrecisionPlugin> plugin)
    : plugin_(std::move(plugin)), given_plugin_(true) {
  if (!plugin_) throw ConfigError("MixedPrecisionHook needs a precision plugin, got null");
}

MixedPrecisionHook::~MixedPrecisionHook() = default;

void MixedPrecisionHook::leave_region() { region_.reset(); }

UpdateDecision MixedPrecisionHook::operator()(TrainContext& ctx, TrainingStage stage,
                                              bool will_skip) {
  ctx.precision = plugin_.get();
  switch (stage) {
    case TrainingStage::BEFORE_BATCH:
      leave_region();  // a region left open by an aborted batch is not nested
      if (plugin_->autocast_dtype()) region_ = plugin_->forward_context(model_device(ctx));
      break;
    case TrainingStage::DO_BACKWARD: {
      leave_region();  // backward runs outside autocast (seed 000)
      if (!ctx.loss.defined()) {
        throw std::logic_error("MixedPrecisionHook needs a defined ctx.loss at DO_BACKWARD, got "
                               "an undefined tensor");
      }
      return {true, plugin_->pre_backward(ctx.loss)};  // scaled under 16-mixed
    }
    case TrainingStage::DO_OPTIMIZER_STEP:
      // Unscale right before a step that proceeds; a vetoed step (e.g. an
      // accumulation batch) keeps the gradients scaled.
      if (!will_skip && plugin_->scaler()) {
        for (auto* opt : ctx.optimizers) {
          if (opt) plugin_->unscale_gradients(*opt);
        }
      }
      break;
    case TrainingStage::AFTER_OPTIMIZER_STEP:
      leave_region();
      // A later hook (e.g. spike skipping) vetoed a step whose gradients we
      // had already unscaled: close the scaler's iteration so the next step
      // unscales again (PyTorch: unscale_ must be followed by update()).
      if (will_skip && plugin_->scaler()) {
        bool pending = false;
        for (auto* opt : ctx.optimizers) {
          pending = pending || (opt && plugin_->scaler()->found_inf(*opt).has_value());
        }
        if (pending) plugin_->scaler()->update();
      }
      break;
    default:
      break;
  }
  return {true, ctx.loss};
}

bool MixedPrecisionHook::owns_optimizer_step() const {
  return plugin_->scaler() != nullptr;
}

OptimizerStepReport MixedPrecisionHook::step_optimizers(TrainContext& ctx) {
  OptimizerStepReport report;
  GradScaler* scaler = plugin_->scaler();
  for (auto* opt : ctx.optimizers) {
    if (!opt) throw std::logic_error("MixedPrecisionHook: ctx.optimizers must not contain null");
    if (scaler) {
      report.skipped.push_back(!scaler->step(*opt));
    } else {
      opt->step();
      report.skipped.push_back(false);
    }
  }
  if (scaler && !ctx.optimizers.empty()) scaler->update();
  return report;
}

void MixedPrecisionHook::exit(bool failed) {
  (void)failed;
  leave_region();
}

std::unique_ptr<AutocastGuard> MixedPrecisionHook::inference_context(at::Device device) const {
  if (!plugin_->autocast_dtype()) return std::make_unique<AutocastGuard>(device, at::kFloat);
  return plugin_->forward_context(device);
}

double MixedPrecisionHook::scale() const {
  const GradScaler* s = static_cast<const PrecisionPlugin&>(*plugin_).scaler();
  if (s) return s->get_scale();
  const auto state = plugin_->state_dict();  // a torn-down scaler's
  auto it = state.find("scale");
  return it != state.end() ? it->second : 1.0;
}

std::map<std::string, at::Tensor> MixedPrecisionHook::hook_state() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [k, v] : state_dict()) out[k] = at::scalar_tensor(v, at::kDouble);
  return out;
}

void MixedPrecisionHook::load_hook_state(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, double> values;
  for (const auto& [k, t] : state) values[k] = t.item<double>();
  if (!values.empty()) load_state_dict(values);
}

}  // namespace crucible
