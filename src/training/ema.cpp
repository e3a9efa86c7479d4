#include "crucible/training/ema.h"

#include <algorithm>

#include "crucible/training/rng_state.h"

#include <ATen/core/grad_mode.h>

#include <sstream>
#include <stdexcept>

#include "crucible/common/error.h"
#include "crucible/models/energy_model.h"
#include "crucible/training/strategy.h"

namespace crucible {

namespace {

constexpr const char* kNumUpdatesKey = "__ema_num_updates__";

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

/// Finds `name` in `shadow`; throws std::invalid_argument naming it.
at::Tensor& find_shadow(std::vector<std::pair<std::string, at::Tensor>>& shadow,
                        const std::string& name, const at::Tensor& target, const char* kind) {
  for (auto& [n, t] : shadow) {
    if (n != name) continue;
    if (!t.sizes().equals(target.sizes())) {
      throw std::invalid_argument("EMA " + std::string(kind) + " '" + name + "' must have shape " +
                                  shape_str(target) + ", got " + shape_str(t));
    }
    return t;
  }
  throw std::invalid_argument("EMA state must contain the module " + std::string(kind) + " '" +
                              name + "', got no such entry");
}

}  // namespace

EmaHook::EmaHook(EmaOptions options) : options_(options) {
  if (!(options_.decay >= 0.0 && options_.decay < 1.0)) {
    std::ostringstream os;
    os << options_.decay;
    throw ConfigError("`decay` must be in [0, 1), got " + os.str());
  }
  if (options_.update_every < 1) {
    throw ConfigError("`update_every` must be >= 1, got " + std::to_string(options_.update_every));
  }
  if (options_.start_step < 0) {
    throw ConfigError("`start_step` must be >= 0, got " + std::to_string(options_.start_step));
  }
}

UpdateDecision EmaHook::operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) {
  if (stage == TrainingStage::SETUP && ctx.model && initialized()) {
    publish(ctx);  // a restored average
    return {true, ctx.loss};
  }
  if (stage != TrainingStage::AFTER_OPTIMIZER_STEP || will_skip || !ctx.model) {
    return {true, ctx.loss};
  }
  const int64_t s = ctx.step_count + 1;
  if (s < options_.start_step || s % options_.update_every != 0) return {true, ctx.loss};
  update(ctx.model->module());
  publish(ctx);
  return {true, ctx.loss};
}


void EmaHook::publish(TrainContext& ctx) {
  if (options_.publish_inference_model && ctx.strategy) {
    if (!inference_) {
      // The copy's fresh initialisation must not draw from the global RNG:
      // a resumed run clones at SETUP, an uninterrupted one at its first
      // update, and both must leave the same rng.pt (issue 14).
      {
        PreservedRngState keep_rng;
        inference_ = ctx.model->clone_model();
      }
      if (!inference_) {
        throw std::logic_error("EmaHook publishes the average for validation through a copy of "
                               "the model, but model '" + ctx.model->name() +
                               "' does not implement EnergyModel::clone_model(); implement it "
                               "or set EmaOptions::publish_inference_model = false");
      }
      for (auto& p : inference_->module().parameters()) p.requires_grad_(false);
    }
    copy_to(inference_->module());
    ctx.strategy->set_inference_model(inference_);
  }
}

void EmaHook::resolve_loaded(torch::nn::Module& module) const {
  if (loaded_.empty()) return;
  size_t matched = 0;
  auto check = [&](const std::string& name, const char* kind) {
    if (loaded_.count(name) == 0) {
      throw std::invalid_argument("EMA state must contain the module " + std::string(kind) +
                                  " '" + name + "', got no such entry");
    }
    ++matched;
  };
  for (const auto& item : module.named_parameters(true)) check(item.key(), "parameter");
  for (const auto& item : module.named_buffers(true)) check(item.key(), "buffer");
  if (matched != loaded_.size()) {
    for (const auto& [n, t] : loaded_) {
      (void)t;
      if (!module.named_parameters(true).contains(n) && !module.named_buffers(true).contains(n)) {
        throw std::invalid_argument("EMA state entries must name module parameters or buffers, "
                                    "got '" + n + "'");
      }
    }
  }
  params_.clear();
  buffers_.clear();
  for (const auto& item : module.named_parameters(true)) {
    auto it = loaded_.find(item.key());
    if (it != loaded_.end()) params_.emplace_back(item.key(), it->second);
  }
  for (const auto& item : module.named_buffers(true)) {
    auto it = loaded_.find(item.key());
    if (it != loaded_.end()) buffers_.emplace_back(item.key(), it->second);
  }
  loaded_.clear();
}

void EmaHook::update(torch::nn::Module& module) {
  resolve_loaded(module);
  at::NoGradGuard no_grad;
  if (!initialized()) {
    for (const auto& item : module.named_parameters(true))
      params_.emplace_back(item.key(), item.value().detach().clone());
    for (const auto& item : module.named_buffers(true))
      buffers_.emplace_back(item.key(), item.value().detach().clone());
  } else {
    // torch_ema use_num_updates (MACE): k = this update's number, from 1.
    const double k = static_cast<double>(num_updates_ + 1);
    const double d = options_.warmup ? std::min(options_.decay, (1.0 + k) / (10.0 + k))
                                     : options_.decay;
    for (const auto& item : module.named_parameters(true)) {
      at::Tensor& sh = find_shadow(params_, item.key(), item.value(), "parameter");
      if (!item.value().requires_grad()) {  // frozen: copied (torch_ema skips it), stays bit-identical
        sh.copy_(item.value().detach());
        continue;
      }
      sh.mul_(d).add_(item.value().detach().to(sh.options()), 1.0 - d);
    }
    for (const auto& item : module.named_buffers(true)) {
      at::Tensor& sh = find_shadow(buffers_, item.key(), item.value(), "buffer");
      sh.copy_(item.value().detach());
    }
  }
  ++num_updates_;
}

void EmaHook::copy_to(torch::nn::Module& module) const {
  if (!initialized()) {
    throw std::logic_error("EmaHook::copy_to needs an initialised average, got none (no update "
                           "or load_state_dict yet)");
  }
  resolve_loaded(module);
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(true)) {
    item.value().copy_(find_shadow(params_, item.key(), item.value(), "parameter"));
  }
  for (auto& item : module.named_buffers(true)) {
    item.value().copy_(find_shadow(buffers_, item.key(), item.value(), "buffer"));
  }
}

void EmaHook::swap_into(torch::nn::Module& module) {
  if (!initialized()) {
    throw std::logic_error("EmaHook::swap_into needs an initialised average, got none (no "
                           "update or load_state_dict yet)");
  }
  resolve_loaded(module);
  at::NoGradGuard no_grad;
  // Check every name first so a failure leaves module and shadow unchanged.
  for (auto& item : module.named_parameters(true)) find_shadow(params_, item.key(), item.value(), "parameter");
  for (auto& item : module.named_buffers(true)) find_shadow(buffers_, item.key(), item.value(), "buffer");
  auto swap = [](at::Tensor& live, at::Tensor& sh) {
    at::Tensor tmp = live.detach().clone();
    live.copy_(sh);
    sh.copy_(tmp);
  };
  for (auto& item : module.named_parameters(true)) {
    swap(item.value(), find_shadow(params_, item.key(), item.value(), "parameter"));
  }
  for (auto& item : module.named_buffers(true)) {
    swap(item.value(), find_shadow(buffers_, item.key(), item.value(), "buffer"));
  }
}

std::map<std::string, at::Tensor> EmaHook::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [n, t] : loaded_) out[n] = t.clone();
  for (const auto& [n, t] : params_) out[n] = t.clone();
  for (const auto& [n, t] : buffers_) out[n] = t.clone();
  out[kNumUpdatesKey] = at::scalar_tensor(num_updates_, at::kLong);
  return out;
}

void EmaHook::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  auto it = state.find(kNumUpdatesKey);
  if (it == state.end() || !it->second.defined()) {
    throw std::invalid_argument(std::string("EMA state must contain '") + kNumUpdatesKey +
                                "', got no such entry");
  }
  std::map<std::string, at::Tensor> loaded;
  for (const auto& [n, t] : state) {
    if (n == kNumUpdatesKey) continue;
    if (!t.defined()) {
      throw std::invalid_argument("EMA state entry '" + n + "' must be a defined tensor, got "
                                  "an undefined one");
    }
    loaded[n] = t.detach().clone();
  }
  num_updates_ = it->second.item<int64_t>();
  params_.clear();
  buffers_.clear();
  loaded_ = std::move(loaded);
}

}  // namespace crucible
