#include "crucible/precision/precision.h"

#include "crucible/common/autocast_state.h"
#include "crucible/common/denormals.h"
#include "crucible/common/error.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>

namespace crucible {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}


}  // namespace

PrecisionMode parse_precision(const std::string& text) {
  std::string t = lower(text);
  if (t.rfind("torch.", 0) == 0) t = t.substr(6);
  if (t == "64-true" || t == "64" || t == "fp64" || t == "float64" || t == "double")
    return PrecisionMode::k64True;
  if (t == "32-true" || t == "32" || t == "fp32" || t == "float32" || t == "float")
    return PrecisionMode::k32True;
  if (t == "bf16-mixed" || t == "bf16" || t == "bfloat16") return PrecisionMode::kBf16Mixed;
  if (t == "16-mixed" || t == "16" || t == "fp16" || t == "float16" || t == "half")
    return PrecisionMode::k16Mixed;
  if (t == "bf16-true") return PrecisionMode::kBf16True;
  if (t == "16-true") return PrecisionMode::k16True;
  throw ConfigError(
      "precision must be one of 64-true, 32-true, bf16-mixed, 16-mixed, bf16-true, 16-true "
      "(aliases: 64, 32, 16, fp64, fp32, fp16, bf16, float64, float32, float16, bfloat16, "
      "double, float, half), got '" + text + "'");
}

std::string precision_name(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::k64True: return "64-true";
    case PrecisionMode::k32True: return "32-true";
    case PrecisionMode::kBf16Mixed: return "bf16-mixed";
    case PrecisionMode::k16Mixed: return "16-mixed";
    case PrecisionMode::kBf16True: return "bf16-true";
    case PrecisionMode::k16True: return "16-true";
  }
  return "unknown";
}

bool autocast_supported(at::DeviceType device_type, at::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  if (device_type == at::kCUDA) return true;
  if (device_type == at::kCPU) {
#if TORCH_VERSION_MAJOR >= 2
    return true;  // CPU fp16 autocast exists from LibTorch 2.x on.
#else
    return dtype == at::kBFloat16;
#endif
  }
  return false;
}

AutocastGuard::AutocastGuard(at::Device device, at::ScalarType dtype)
    : device_type_(device.type()) {
  if (!autocast_supported(device_type_, dtype)) return;
  prev_enabled_ = autocast_enabled(device_type_);
  prev_dtype_ = autocast_dtype(device_type_);
  set_autocast_dtype(device_type_, dtype);  // dtype first, then enable
  set_autocast_enabled(device_type_, true);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(device_type_, prev_enabled_);
  set_autocast_dtype(device_type_, prev_dtype_);
}

PrecisionPlugin::DefaultDtypeGuard::DefaultDtypeGuard(at::ScalarType dtype)
    : previous_(c10::get_default_dtype()) {
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
}

PrecisionPlugin::DefaultDtypeGuard::~DefaultDtypeGuard() { c10::set_default_dtype(previous_); }

PrecisionPlugin::PrecisionPlugin(PrecisionMode mode, GradScalerOptions scaler_options)
    : mode_(mode), scaler_options_(scaler_options) {
  if (mode_ == PrecisionMode::k16Mixed) scaler_options_.validate();
}

at::ScalarType PrecisionPlugin::param_dtype() const {
  switch (mode_) {
    case PrecisionMode::k64True: return at::kDouble;
    case PrecisionMode::kBf16True: return at::kBFloat16;
    case PrecisionMode::k16True: return at::kHalf;
    default: return at::kFloat;
  }
}

at::ScalarType PrecisionPlugin::input_dtype() const {
  // Geometry (positions, cell, shifts) is never below float32, also in the
  // *-true half modes: forces and stress are derivatives w.r.t. it.
  return mode_ == PrecisionMode::k64True ? at::kDouble : at::kFloat;
}

std::optional<at::ScalarType> PrecisionPlugin::autocast_dtype() const {
  if (mode_ == PrecisionMode::kBf16Mixed) return at::kBFloat16;
  if (mode_ == PrecisionMode::k16Mixed) return at::kHalf;
  return std::nullopt;
}

void PrecisionPlugin::convert_module(torch::nn::Module& module) const { module.to(param_dtype()); }

Batch PrecisionPlugin::convert_input(const Batch& batch, at::Device device) const {
  return batch.to(device, input_dtype());
}

ModelOutputs PrecisionPlugin::convert_output(const ModelOutputs& outputs) const {
  auto up = [](const at::Tensor& t) {
    if (!t.defined() || t.scalar_type() == at::kDouble || t.scalar_type() == at::kFloat) return t;
    return t.to(at::kFloat);
  };
  auto float64 = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; };
  ModelOutputs out{float64(outputs.energy), up(outputs.forces), up(outputs.stress)};
  out.energies = float64(outputs.energies);
  return out;
}

std::unique_ptr<AutocastGuard> PrecisionPlugin::forward_context(at::Device device) const {
  const auto dtype = autocast_dtype();
  if (!dtype) return std::make_unique<AutocastGuard>(device, at::kFloat);
  if (!autocast_supported(device.type(), *dtype)) {
    TORCH_WARN_ONCE("precision 16-mixed: this LibTorch has no float16 autocast on ",
                    device.str(), "; the forward runs in float32 and only the gradient-scaler "
                    "path of 16-mixed is active");
  }
  return std::make_unique<AutocastGuard>(device, *dtype);
}

std::unique_ptr<PrecisionPlugin::DefaultDtypeGuard> PrecisionPlugin::module_init_context() const {
  return tensor_init_context();
}

std::unique_ptr<PrecisionPlugin::DefaultDtypeGuard> PrecisionPlugin::tensor_init_context() const {
  return std::make_unique<DefaultDtypeGuard>(param_dtype());
}

at::Tensor PrecisionPlugin::pre_backward(const at::Tensor& loss) {
  if (mode_ != PrecisionMode::k16Mixed) return loss;
  if (!scaler_) scaler_ = std::make_unique<GradScaler>(scaler_options_);
  if (pending_state_) {
    scaler_->load_state_dict(*pending_state_);
    pending_state_.reset();
  }
  return scaler_->scale(loss);
}

void backward_into(const at::Tensor& loss, const std::vector<at::Tensor>& parameters) {
  // Every backward Crucible runs flushes, as every compute_outputs does:
  // callers outside a training run (the thread choice's timing pass) once
  // ran theirs unflushed (common/denormals.h).
  const DenormalFlushGuard flush;
  if (parameters.empty()) {
    loss.backward();
  } else {
    loss.backward({}, c10::nullopt, /*create_graph=*/false, at::TensorList(parameters));
  }
}

void PrecisionPlugin::backward(const at::Tensor& loss, const std::vector<at::Tensor>& parameters) {
  backward_into(loss, parameters);
}

void PrecisionPlugin::post_backward(const at::Tensor& loss) { (void)loss; }

void PrecisionPlugin::unscale_gradients(torch::optim::Optimizer& optimizer) {
  if (scaler_ && !scaler_->found_inf(optimizer).has_value()) scaler_->unscale(optimizer);
}

bool PrecisionPlugin::optimizer_step(torch::optim::Optimizer& optimizer) {
  if (!scaler_) {
    optimizer.step();
    return true;
  }
  const bool ran = scaler_->step(optimizer);
  scaler_->update();
  return ran;
}

std::vector<at::Tensor> PrecisionPlugin::main_params(torch::optim::Optimizer& optimizer) const {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) params.push_back(p);
  return params;
}

std::map<std::string, double> PrecisionPlugin::state_dict() const {
  if (scaler_) return scaler_->state_dict();
  if (pending_state_) return *pending_state_;
  return {};
}

void PrecisionPlugin::load_state_dict(const std::map<std::string, double>& state) {
  if (mode_ != PrecisionMode::k16Mixed) return;
  if (state.empty()) {
    throw std::invalid_argument("precision 16-mixed: state must hold the gradient scaler's state, "
                                "got an empty state");
  }
  if (scaler_) {
    scaler_->load_state_dict(state);
  } else {
    pending_state_ = state;
  }
}

void PrecisionPlugin::teardown() {
  if (!scaler_) return;
  if (scaler_->is_enabled()) pending_state_ = scaler_->state_dict();
  scaler_.reset();
}

Batch keep_geometry_float32(Batch batch) {
  for (at::Tensor* t : {&batch.positions, &batch.cell, &batch.shifts}) {
    if (t->defined() && (t->scalar_type() == at::kHalf || t->scalar_type() == at::kBFloat16)) {
      *t = t->to(at::kFloat);
    }
  }
  return batch;
}

PrecisionMode precision_from_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return PrecisionMode::k32True;
    case at::kBFloat16: return PrecisionMode::kBf16Mixed;
    case at::kHalf: return PrecisionMode::k16Mixed;
    case at::kDouble: return PrecisionMode::k64True;
    default: break;
  }
  throw ConfigError(std::string("precision dtype must be one of float32, bfloat16, float16, "
                                "float64, got ") + c10::toString(dtype));
}

std::unique_ptr<PrecisionPlugin> make_precision_plugin(const std::string& mode,
                                                       GradScalerOptions scaler_options) {
  return std::make_unique<PrecisionPlugin>(parse_precision(mode), scaler_options);
}

}  // namespace crucible
