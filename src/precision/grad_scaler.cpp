// Dynamic loss scaling (PyTorch torch.cuda.amp.GradScaler semantics; seed 000).

#include "crucible/precision/grad_scaler.h"

#include "crucible/common/error.h"

#include <cmath>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace crucible {
namespace {

std::string fmt_value(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void check_factors(double init_scale, double growth_factor, double backoff_factor,
                   int64_t growth_interval) {
  if (!(std::isfinite(init_scale) && init_scale > 0.0))
    throw ConfigError("init_scale must be finite and > 0, got " + fmt_value(init_scale));
  if (!(std::isfinite(growth_factor) && growth_factor > 1.0))
    throw ConfigError("growth_factor must be > 1, got " + fmt_value(growth_factor));
  if (!(backoff_factor > 0.0 && backoff_factor < 1.0))
    throw ConfigError("backoff_factor must be in (0, 1), got " + fmt_value(backoff_factor));
  if (growth_interval < 1)
    throw ConfigError("growth_interval must be >= 1, got " + std::to_string(growth_interval));
}

// A 0-dim float32 copy of `t` on `device` (cached by the caller per device).
at::Tensor on_device(const at::Tensor& t, const at::Device& device) {
  return t.device() == device ? t : t.to(device);
}

double required_key(const std::map<std::string, double>& state, const std::string& key) {
  auto it = state.find(key);
  if (it == state.end())
    throw std::invalid_argument("GradScaler state dict lacks \"" + key + "\"");
  return it->second;
}

}  // namespace

void GradScalerOptions::validate() const {
  check_factors(init_scale, growth_factor, backoff_factor, growth_interval);
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  options_.validate();
}

void GradScaler::require_scale(const char* caller) const {
  if (!scale_.defined())
    throw std::logic_error(std::string("GradScaler: ") + caller +
                           "() called before scale(); scale the loss earlier in the iteration");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  if (!loss.defined()) throw std::invalid_argument("GradScaler::scale: loss is undefined");
  if (!c10::isFloatingType(loss.scalar_type()))
    throw std::invalid_argument(std::string("GradScaler::scale: loss must be floating point, got ") +
                                c10::toString(loss.scalar_type()));
  if (!scale_.defined()) {
    const auto dev = loss.device();
    scale_ = at::full({1}, options_.init_scale, at::TensorOptions().dtype(at::kFloat).device(dev));
    growth_tracker_ = at::full({1}, init_growth_tracker_,
                               at::TensorOptions().dtype(at::kInt).device(dev));
  }
  const auto dtype = c10::promoteTypes(loss.scalar_type(), at::kFloat);
  // 0-dim factor so the loss keeps its shape (PyTorch's [1] scale would
  // broadcast a 0-dim loss to [1]).
  const at::Tensor factor = on_device(scale_, loss.device()).reshape({}).to(dtype);
  return loss.to(dtype) * factor;
}

void GradScaler::unscale_grads(torch::optim::Optimizer& optimizer, OptimizerState& state) {
  at::NoGradGuard no_grad;
  const at::Device scale_dev = scale_.device();
  // FP32 division can be imprecise, so the reciprocal is taken in FP64 (PyTorch).
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);  // [1]
  at::Tensor found = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(scale_dev));

  // Collect the tensors to unscale: dense grads, or the values of sparse ones.
  std::vector<at::Tensor> targets;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      at::Tensor grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        // Coalescing sums duplicate indices; for scaled fp16 values that sum
        // may overflow, so check the coalesced values.
        if (grad.scalar_type() == at::kHalf) {
          grad = grad.coalesce();
          param.mutable_grad() = grad;
        }
        targets.push_back(grad._values());
      } else {
        targets.push_back(grad);
      }
    }
  }
  if (targets.empty()) {
    state.found_inf = at::Tensor();
    return;
  }

  // Group by device; on CUDA use the fused kernel per (device, dtype).
  std::vector<std::pair<at::Device, std::vector<at::Tensor>>> by_device;
  for (auto& t : targets) {
    auto it = by_device.begin();
    for (; it != by_device.end(); ++it)
      if (it->first == t.device()) break;
    if (it == by_device.end()) {
      by_device.emplace_back(t.device(), std::vector<at::Tensor>{});
      it = std::prev(by_device.end());
    }
    it->second.push_back(t);
  }

  for (auto& [device, tensors] : by_device) {
    const at::Tensor inv_dev = on_device(inv_scale, device);
    at::Tensor found_dev = device == scale_dev
                               ? found
                               : at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
    if (device.is_cuda()) {
      // Fused path: one kernel per dtype (the op requires a common dtype).
      std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> by_dtype;
      for (auto& t : tensors) {
        auto it = by_dtype.begin();
        for (; it != by_dtype.end(); ++it)
          if (it->first == t.scalar_type()) break;
        if (it == by_dtype.end()) {
          by_dtype.emplace_back(t.scalar_type(), std::vector<at::Tensor>{});
          it = std::prev(by_dtype.end());
        }
        it->second.push_back(t);
      }
      for (auto& [dtype, list] : by_dtype) {
        (void)dtype;
        at::_amp_foreach_non_finite_check_and_unscale_(list, found_dev, inv_dev);
      }
    } else {
      // Plain ops: check finiteness of the scaled values first (as the fused
      // kernel does), then multiply in float32 (float64 stays float64).
      const at::Tensor inv0 = inv_dev.reshape({});
      for (auto& t : tensors) {
        if (t.numel() == 0) continue;
        const at::Tensor bad = at::isfinite(t).logical_not().any();
        found_dev.masked_fill_(bad, 1.0);
        const auto st = t.scalar_type();
        if (st == at::kFloat || st == at::kDouble) {
          t.mul_(inv0);
        } else {
          t.copy_(t.to(at::kFloat).mul_(inv0));
        }
      }
    }
    if (device != scale_dev) found.add_(found_dev.to(scale_dev));
  }
  state.found_inf = found;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  require_scale("unscale");
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled)
    throw std::logic_error(
        "unscale() has already been called on this optimizer since the last update()");
  if (state.stage == Stage::kStepped)
    throw std::logic_error("unscale() is being called after step()");
  unscale_grads(optimizer, state);
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  require_scale("step");
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kStepped)
    throw std::logic_error("step() has already been called on this optimizer since the last update()");
  if (state.stage == Stage::kReady) unscale(optimizer);
  if (!state.found_inf.defined())
    throw std::logic_error("No inf checks were recorded for this optimizer (no parameter has a gradient)");
  const bool skip = state.found_inf.item<float>() != 0.0f;
  if (!skip) optimizer.step();
  state.stage = Stage::kStepped;
  return !skip;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  require_scale("update");
  at::Tensor combined;
  for (auto& [opt, state] : per_optimizer_) {
    (void)opt;
    if (!state.found_inf.defined()) continue;
    combined = combined.defined() ? combined + state.found_inf : state.found_inf.clone();
  }
  if (!combined.defined())
    throw std::logic_error("No inf checks were recorded prior to update()");

  if (scale_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  } else {
    // Same arithmetic as the fused kernel: float32 scale times a double
    // factor, rounded to float32; growth only to a finite value.
    float s = scale_.item<float>();
    int64_t tracker = growth_tracker_.item<int>();
    if (combined.item<float>() != 0.0f) {
      s = static_cast<float>(static_cast<double>(s) * options_.backoff_factor);
      tracker = 0;
    } else {
      const int64_t successful = tracker + 1;
      if (successful == options_.growth_interval) {
        const float grown = static_cast<float>(static_cast<double>(s) * options_.growth_factor);
        if (std::isfinite(grown)) s = grown;
        tracker = 0;
      } else {
        tracker = successful;
      }
    }
    scale_.fill_(s);
    growth_tracker_.fill_(tracker);
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  require_scale("update");
  if (!(std::isfinite(new_scale) && new_scale > 0.0))
    throw std::invalid_argument("GradScaler::update: new_scale must be finite and > 0, got " +
                                fmt_value(new_scale));
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : options_.init_scale;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!options_.enabled) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int>() : init_growth_tracker_;
}

std::optional<bool> GradScaler::found_inf(const torch::optim::Optimizer& optimizer) const {
  if (!options_.enabled) return std::nullopt;
  auto it = per_optimizer_.find(&optimizer);
  if (it == per_optimizer_.end() || it->second.stage == Stage::kReady ||
      !it->second.found_inf.defined())
    return std::nullopt;
  return it->second.found_inf.item<float>() != 0.0f;
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", get_scale()},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)},
          {"_growth_tracker", static_cast<double>(get_growth_tracker())}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!options_.enabled) return;
  if (state.empty())
    throw std::invalid_argument(
        "GradScaler state dict is empty, possibly because it was saved from a disabled GradScaler");
  const double scale = required_key(state, "scale");
  const double growth = required_key(state, "growth_factor");
  const double backoff = required_key(state, "backoff_factor");
  const double interval = required_key(state, "growth_interval");
  const double tracker = required_key(state, "_growth_tracker");
  if (!(std::isfinite(interval) && interval == std::floor(interval)))
    throw ConfigError("growth_interval must be an integer >= 1, got " + fmt_value(interval));
  if (!(std::isfinite(tracker) && tracker >= 0.0 && tracker == std::floor(tracker)))
    throw std::invalid_argument("GradScaler state dict \"_growth_tracker\" must be an integer >= 0, got " +
                                fmt_value(tracker));
  check_factors(scale, growth, backoff, static_cast<int64_t>(interval));

  options_.init_scale = scale;
  options_.growth_factor = growth;
  options_.backoff_factor = backoff;
  options_.growth_interval = static_cast<int64_t>(interval);
  init_growth_tracker_ = static_cast<int64_t>(tracker);
  if (scale_.defined()) scale_.fill_(scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(init_growth_tracker_);
}

}  // namespace crucible
