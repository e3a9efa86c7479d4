#include "crucible/training/best_model.h"

#include "crucible/common/error.h"
#include "crucible/models/energy_model.h"
#include "crucible/training/metrics.h"
#include "crucible/training/strategy.h"

#include <torch/nn/module.h>

#include <fmt/format.h>

namespace crucible {

namespace {

at::Tensor long_scalar(int64_t v) { return at::scalar_tensor(v, at::kLong); }

const at::Tensor& entry(const std::map<std::string, at::Tensor>& state, const std::string& key) {
  auto it = state.find(key);
  if (it == state.end()) {
    throw std::invalid_argument("BestModelHook state must contain '" + key + "', got no such entry");
  }
  return it->second;
}

}  // namespace

BestModelHook::BestModelHook(BestModelOptions options) : options_(std::move(options)) {
  try {
    (void)validation_monitor_value(ValidationSummary{}, options_.monitor);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("`monitor` ") + e.what());
  }
  if (options_.patience < 0) {
    throw ConfigError("`patience` must be >= 0, got " + std::to_string(options_.patience));
  }
  if (options_.restart_at_epoch && *options_.restart_at_epoch < 0) {
    throw ConfigError("`restart_at_epoch` must be >= 0, got " +
                      std::to_string(*options_.restart_at_epoch));
  }
}

void BestModelHook::operator()(TrainContext& ctx, TrainingStage stage) {
  if (stage != TrainingStage::AFTER_VALIDATION || !ctx.validation) return;
  if (options_.restart_at_epoch && !restarted_ && ctx.epoch_count >= *options_.restart_at_epoch) {
    best_ = std::numeric_limits<double>::infinity();
    num_bad_ = 0;
    restarted_ = true;  // the weights stay until a stage-two validation replaces them
  }
  const double v = validation_monitor_value(*ctx.validation, options_.monitor);
  if (v < best_) {
    best_ = v;
    best_epoch_ = ctx.epoch_count;
    best_step_ = ctx.step_count;
    num_bad_ = 0;
    std::shared_ptr<EnergyModel> inference;
    if (ctx.validation->inference_model && ctx.strategy) inference = ctx.strategy->inference_model();
    EnergyModel* validated = inference ? inference.get() : ctx.model;
    if (!validated) throw std::logic_error("BestModelHook: the context has no model");
    weights_.clear();
    for (const auto& p : validated->module().named_parameters(true)) {
      weights_["param." + p.key()] = p.value().detach().to(at::kCPU).clone();
    }
    for (const auto& b : validated->module().named_buffers(true)) {
      weights_["buffer." + b.key()] = b.value().detach().to(at::kCPU).clone();
    }
    return;
  }
  ++num_bad_;
  if (options_.patience > 0 && num_bad_ >= options_.patience && ctx.strategy) {
    ctx.strategy->request_finish(fmt::format(
        "early stopping: {} validations without a lower {} than {:.6g} (epoch {})", num_bad_,
        options_.monitor, best_, best_epoch_));
  }
}

void BestModelHook::copy_best_into(torch::nn::Module& module) const {
  if (weights_.empty()) {
    throw std::logic_error("BestModelHook::copy_best_into: no validation has improved yet");
  }
  at::NoGradGuard no_grad;
  auto copy = [&](const std::string& key, at::Tensor target) {
    auto it = weights_.find(key);
    if (it == weights_.end()) {
      throw std::invalid_argument("BestModelHook: the best weights have no '" + key + "'");
    }
    if (it->second.sizes() != target.sizes()) {
      throw std::invalid_argument("BestModelHook: '" + key + "' must have the module's shape");
    }
    target.copy_(it->second);
  };
  for (const auto& p : module.named_parameters(true)) copy("param." + p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) copy("buffer." + b.key(), b.value());
}

std::map<std::string, at::Tensor> BestModelHook::hook_state() const {
  std::map<std::string, at::Tensor> out = {
      {"best", at::scalar_tensor(best_, at::kDouble)},
      {"best_epoch", long_scalar(best_epoch_)},
      {"best_step", long_scalar(best_step_)},
      {"num_bad", long_scalar(num_bad_)},
      {"restarted", long_scalar(restarted_ ? 1 : 0)}};
  for (const auto& [k, v] : weights_) out["weights." + k] = v;
  return out;
}

void BestModelHook::load_hook_state(const std::map<std::string, at::Tensor>& state) {
  const double best = entry(state, "best").item<double>();
  const int64_t epoch = entry(state, "best_epoch").item<int64_t>();
  const int64_t step = entry(state, "best_step").item<int64_t>();
  const int64_t bad = entry(state, "num_bad").item<int64_t>();
  const bool restarted = entry(state, "restarted").item<int64_t>() != 0;
  std::map<std::string, at::Tensor> weights;
  const std::string prefix = "weights.";
  for (const auto& [k, v] : state) {
    if (k.rfind(prefix, 0) == 0) weights[k.substr(prefix.size())] = v.to(at::kCPU).clone();
  }
  best_ = best;
  best_epoch_ = epoch;
  best_step_ = step;
  num_bad_ = bad;
  restarted_ = restarted;
  weights_ = std::move(weights);
}

}  // namespace crucible
