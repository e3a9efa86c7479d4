#include "crucible/training/spike_skipping.h"

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <vector>

#include "crucible/common/error.h"
#include "crucible/precision/precision.h"

namespace crucible {

namespace {

double median_of(std::vector<double> v) {
  const size_t n = v.size();
  const size_t mid = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (n % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lo + hi);
}

/// Total 2-norm of the defined gradients of all optimizers' parameters
/// (each parameter once), in float64.
double grad_norm(const TrainContext& ctx) {
  double sq = 0.0;
  for (const auto& p : optimizer_parameters(ctx)) {
    const auto& g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    const double n = g.detach().to(at::kDouble).norm().item<double>();
    sq += n * n;
  }
  return std::sqrt(sq);
}

}  // namespace

SpikeSkippingHook::SpikeSkippingHook(SpikeSkippingOptions options) : options_(options) {
  if (!(std::isfinite(options_.k) && options_.k > 0)) {
    std::ostringstream os;
    os << options_.k;
    throw ConfigError("`k` must be finite and > 0, got " + os.str());
  }
  if (options_.window < 1) {
    throw ConfigError("`window` must be >= 1, got " + std::to_string(options_.window));
  }
  if (options_.min_history < 1 || options_.min_history > options_.window) {
    throw ConfigError("`min_history` must be in [1, window] = [1, " +
                      std::to_string(options_.window) + "], got " +
                      std::to_string(options_.min_history));
  }
}

std::optional<double> SpikeSkippingHook::threshold() const {
  if (static_cast<int64_t>(history_.size()) < options_.min_history) return std::nullopt;
  std::vector<double> v(history_.begin(), history_.end());
  const double med = median_of(v);
  for (auto& x : v) x = std::abs(x - med);
  const double mad = std::max(median_of(std::move(v)), 1e-8 * std::max(1.0, std::abs(med)));
  return med + options_.k * mad;
}

UpdateDecision SpikeSkippingHook::operator()(TrainContext& ctx, TrainingStage stage,
                                             bool will_skip) {
  if (stage == TrainingStage::AFTER_OPTIMIZER_STEP) {
    if (pending_ && !will_skip) {
      history_.push_back(*pending_);
      while (static_cast<int64_t>(history_.size()) > options_.window) history_.pop_front();
    }
    pending_.reset();
    return {true, ctx.loss};
  }
  if (stage != TrainingStage::DO_OPTIMIZER_STEP) return {true, ctx.loss};
  pending_.reset();
  if (will_skip) return {true, ctx.loss};

  auto veto = [&](const char* reason) {
    ++skipped_steps_;
    last_skip_reason_ = reason;
    return UpdateDecision{false, ctx.loss};
  };
  std::optional<double> loss;
  if (ctx.loss.defined()) loss = ctx.loss.detach().to(at::kDouble).sum().item<double>();
  if (loss && !std::isfinite(*loss)) return veto("non-finite loss");
  const bool scaler_active = ctx.precision && ctx.precision->scaler() != nullptr;
  if (!scaler_active && !std::isfinite(grad_norm(ctx))) return veto("non-finite gradient norm");
  if (loss) {
    if (auto t = threshold(); t && *loss > *t) return veto("loss spike");
    pending_ = *loss;
  }
  return {true, ctx.loss};
}

std::map<std::string, at::Tensor> SpikeSkippingHook::hook_state() const {
  std::vector<double> history(history_.begin(), history_.end());
  std::map<std::string, at::Tensor> out;
  out["history"] = at::tensor(history, at::kDouble);
  out["pending"] = pending_ ? at::tensor(std::vector<double>{*pending_}, at::kDouble)
                            : at::zeros({0}, at::kDouble);
  out["skipped_steps"] = at::scalar_tensor(skipped_steps_, at::kLong);
  return out;
}

void SpikeSkippingHook::load_hook_state(const std::map<std::string, at::Tensor>& state) {
  for (const char* key : {"history", "pending", "skipped_steps"}) {
    if (state.count(key) == 0) {
      throw std::invalid_argument(std::string("SpikeSkippingHook state must contain '") + key +
                                  "', got no such entry");
    }
  }
  const at::Tensor h = state.at("history").to(at::kDouble).contiguous();
  history_.assign(h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
  const at::Tensor p = state.at("pending").to(at::kDouble);
  pending_.reset();
  if (p.numel() > 0) pending_ = p[0].item<double>();
  skipped_steps_ = state.at("skipped_steps").item<int64_t>();
}

}  // namespace crucible
