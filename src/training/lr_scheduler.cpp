#include "crucible/training/lr_scheduler.h"

#include "crucible/common/error.h"

#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace crucible {

namespace {

constexpr double kPi = 3.14159265358979323846;

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void require(bool ok, const std::string& option, const std::string& expected,
             const std::string& got) {
  if (!ok) throw ConfigError("`" + option + "` must be " + expected + ", got " + got);
}

double get(const std::map<std::string, double>& state, const std::string& key) {
  auto it = state.find(key);
  if (it == state.end()) {
    throw std::invalid_argument("scheduler state must contain '" + key + "', got no such entry");
  }
  return it->second;
}

}  // namespace

// ---------------------------------------------------------------- LrScheduler

LrScheduler::LrScheduler(torch::optim::Optimizer& optimizer) : optimizer_(&optimizer) {
  if (optimizer.param_groups().empty()) {
    throw std::invalid_argument("LrScheduler needs an optimizer with at least one param group, "
                                "got none");
  }
  for (auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
}

void LrScheduler::step() {
  if (metric_driven()) {
    throw std::logic_error("scheduler '" + name() + "' is metric-driven: call step(metric) "
                           "after validation, not step()");
  }
  ++last_step_;
  apply();
}

void LrScheduler::step(double metric) {
  (void)metric;
  throw std::logic_error("scheduler '" + name() + "' is stepped per optimizer step: call "
                         "step(), not step(metric)");
}

std::vector<double> LrScheduler::last_lr() const {
  std::vector<double> out;
  for (auto& group : optimizer_->param_groups()) out.push_back(group.options().get_lr());
  return out;
}

void LrScheduler::hold(double lr) {
  if (!(lr > 0.0) || !std::isfinite(lr)) {
    throw std::invalid_argument("a held learning rate must be finite and > 0, got " + num(lr));
  }
  held_lr_ = lr;
  for (size_t g = 0; g < base_lrs_.size(); ++g) set_lr(g, lr);
}

void LrScheduler::apply() {
  if (held_lr_) {
    for (size_t g = 0; g < base_lrs_.size(); ++g) set_lr(g, *held_lr_);
    return;
  }
  for (size_t g = 0; g < base_lrs_.size(); ++g) set_lr(g, lr_at(last_step_, base_lrs_[g]));
}

void LrScheduler::set_lr(size_t group, double lr) {
  optimizer_->param_groups().at(group).options().set_lr(lr);
}

std::map<std::string, double> LrScheduler::state_dict() const {
  std::map<std::string, double> out;
  out["last_step"] = static_cast<double>(last_step_);
  out["num_groups"] = static_cast<double>(base_lrs_.size());
  for (size_t g = 0; g < base_lrs_.size(); ++g) out["base_lr." + std::to_string(g)] = base_lrs_[g];
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    out["lr." + std::to_string(g)] = optimizer_->param_groups()[g].options().get_lr();
  }
  if (held_lr_) out["held_lr"] = *held_lr_;
  return out;
}

void LrScheduler::load_state_dict(const std::map<std::string, double>& state) {
  const auto groups = static_cast<size_t>(get(state, "num_groups"));
  if (groups != optimizer_->param_groups().size()) {
    throw std::invalid_argument("scheduler state must have " +
                                std::to_string(optimizer_->param_groups().size()) +
                                " param groups (the optimizer's), got " + std::to_string(groups));
  }
  std::vector<double> base;
  for (size_t g = 0; g < groups; ++g) base.push_back(get(state, "base_lr." + std::to_string(g)));
  const auto step = static_cast<int64_t>(get(state, "last_step"));
  base_lrs_ = std::move(base);
  last_step_ = step;
  held_lr_.reset();
  if (auto h = state.find("held_lr"); h != state.end()) held_lr_ = h->second;
  if (held_lr_) {
    apply();
  } else if (metric_driven()) {
    for (size_t g = 0; g < groups; ++g) set_lr(g, get(state, "lr." + std::to_string(g)));
  } else {
    apply();
  }
}

// ---------------------------------------------------------------- per-step schedules

ConstantLr::ConstantLr(torch::optim::Optimizer& optimizer, WarmupOptions warmup)
    : LrScheduler(optimizer), warmup_(warmup) {
  require(warmup_.steps >= 0, "warmup_steps", ">= 0", std::to_string(warmup_.steps));
  require(warmup_.start_factor >= 0.0 && warmup_.start_factor <= 1.0, "warmup_start_factor",
          "in [0, 1]", num(warmup_.start_factor));
  apply();
}

double ConstantLr::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_.steps) {
    const double f0 = warmup_.start_factor;
    return base_lr * (f0 + (1.0 - f0) * static_cast<double>(step) /
                               static_cast<double>(warmup_.steps));
  }
  return base_lr;
}

StepLr::StepLr(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma,
               WarmupOptions warmup)
    : ConstantLr(optimizer, warmup), step_size_(step_size), gamma_(gamma) {
  require(step_size_ >= 1, "step_size", ">= 1", std::to_string(step_size_));
  require(gamma_ > 0.0 && gamma_ <= 1.0, "gamma", "in (0, 1]", num(gamma_));
  apply();
}

double StepLr::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_.steps) return ConstantLr::lr_at(step, base_lr);
  const int64_t s = step - warmup_.steps;
  return base_lr * std::pow(gamma_, static_cast<double>(s / step_size_));
}

ExponentialLr::ExponentialLr(torch::optim::Optimizer& optimizer, double gamma,
                             WarmupOptions warmup)
    : ConstantLr(optimizer, warmup), gamma_(gamma) {
  require(gamma_ > 0.0 && gamma_ <= 1.0, "gamma", "in (0, 1]", num(gamma_));
  apply();
}

double ExponentialLr::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_.steps) return ConstantLr::lr_at(step, base_lr);
  return base_lr * std::pow(gamma_, static_cast<double>(step - warmup_.steps));
}

CosineAnnealingLr::CosineAnnealingLr(torch::optim::Optimizer& optimizer, int64_t t_max,
                                     double final_factor, WarmupOptions warmup)
    : ConstantLr(optimizer, warmup), t_max_(t_max), final_factor_(final_factor) {
  require(t_max_ >= 1, "t_max", ">= 1 step", std::to_string(t_max_));
  require(final_factor_ >= 0.0 && final_factor_ <= 1.0, "final_lr_factor", "in [0, 1]",
          num(final_factor_));
  apply();
}

double CosineAnnealingLr::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_.steps) return ConstantLr::lr_at(step, base_lr);
  const int64_t s = std::min(step - warmup_.steps, t_max_);
  const double eta_min = base_lr * final_factor_;
  return eta_min + 0.5 * (base_lr - eta_min) *
                       (1.0 + std::cos(kPi * static_cast<double>(s) / static_cast<double>(t_max_)));
}

// ---------------------------------------------------------------- ReduceLrOnPlateau

ReduceLrOnPlateau::ReduceLrOnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options)
    : LrScheduler(optimizer),
      options_(std::move(options)),
      best_(std::numeric_limits<double>::infinity()) {
  const auto& o = options_;
  require(!o.monitor.empty(), "monitor", "a validation metric name (e.g. forces_mae)", "\"\"");
  require(o.factor > 0.0 && o.factor < 1.0, "factor", "in (0, 1)", num(o.factor));
  require(o.patience >= 0, "patience", ">= 0", std::to_string(o.patience));
  require(o.threshold >= 0.0, "threshold", ">= 0", num(o.threshold));
  require(o.cooldown >= 0, "cooldown", ">= 0", std::to_string(o.cooldown));
  require(o.min_lr >= 0.0, "min_lr", ">= 0", num(o.min_lr));
  require(o.eps >= 0.0, "eps", ">= 0", num(o.eps));
}

double ReduceLrOnPlateau::lr_at(int64_t step, double base_lr) const {
  (void)step;
  return base_lr;  // not used: the lr lives in the optimizer (see step(metric)).
}

void ReduceLrOnPlateau::step(double metric) {
  ++last_step_;
  if (held_lr_) return;  // stage two: the metric no longer moves the lr
  // NaN compares false: it is never an improvement.
  if (metric < best_ * (1.0 - options_.threshold) || (std::isinf(best_) && metric < best_)) {
    best_ = metric;
    num_bad_ = 0;
  } else {
    ++num_bad_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_ = 0;
  }
  if (num_bad_ > options_.patience) {
    auto& groups = optimizer_->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const double old_lr = groups[g].options().get_lr();
      const double new_lr = std::max(old_lr * options_.factor, options_.min_lr);
      if (old_lr - new_lr > options_.eps) set_lr(g, new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_ = 0;
  }
}

std::map<std::string, double> ReduceLrOnPlateau::state_dict() const {
  auto out = LrScheduler::state_dict();
  out["best"] = best_;
  out["num_bad_steps"] = static_cast<double>(num_bad_);
  out["cooldown_counter"] = static_cast<double>(cooldown_counter_);
  return out;
}

void ReduceLrOnPlateau::load_state_dict(const std::map<std::string, double>& state) {
  const double best = get(state, "best");
  const auto bad = static_cast<int64_t>(get(state, "num_bad_steps"));
  const auto cooldown = static_cast<int64_t>(get(state, "cooldown_counter"));
  LrScheduler::load_state_dict(state);
  best_ = best;
  num_bad_ = bad;
  cooldown_counter_ = cooldown;
}

void step_lr_schedulers(const std::vector<LrScheduler*>& schedulers,
                        const std::vector<bool>& skipped) {
  if (!skipped.empty() && skipped.size() < schedulers.size()) {
    throw std::invalid_argument("step_lr_schedulers: one skipped flag per scheduler (" +
                                std::to_string(schedulers.size()) + ") is needed, got " +
                                std::to_string(skipped.size()));
  }
  for (size_t i = 0; i < schedulers.size(); ++i) {
    LrScheduler* s = schedulers[i];
    if (!s || s->metric_driven()) continue;
    if (!skipped.empty() && skipped[i]) continue;
    s->step();
  }
}

// ---------------------------------------------------------------- factory

void check_scheduler_config(const SchedulerConfig& config, const std::string& path) {
  torch::optim::SGD probe(std::vector<at::Tensor>{at::zeros({1})}, torch::optim::SGDOptions(1.0));
  try {
    (void)make_lr_scheduler(config, probe, 1);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

std::unique_ptr<LrScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                               torch::optim::Optimizer& optimizer,
                                               int64_t total_steps) {
  const auto& c = config;
  if (c.name == "constant") return std::make_unique<ConstantLr>(optimizer, c.warmup);
  if (c.name == "step") return std::make_unique<StepLr>(optimizer, c.step_size, c.gamma, c.warmup);
  if (c.name == "exponential") return std::make_unique<ExponentialLr>(optimizer, c.gamma, c.warmup);
  if (c.name == "cosine") {
    int64_t t_max = c.t_max;
    if (t_max == 0) t_max = std::max<int64_t>(1, total_steps - std::max<int64_t>(0, c.warmup.steps));
    return std::make_unique<CosineAnnealingLr>(optimizer, t_max, c.final_lr_factor, c.warmup);
  }
  if (c.name == "plateau") {
    if (c.warmup.steps != 0) {
      throw ConfigError("`warmup_steps` must be 0 with the plateau scheduler (a metric-driven "
                        "schedule has no per-step clock), got " +
                        std::to_string(c.warmup.steps));
    }
    return std::make_unique<ReduceLrOnPlateau>(optimizer, c.plateau);
  }
  throw ConfigError("`name` must be one of constant, cosine, step, exponential, plateau, got '" +
                    c.name + "'");
}

}  // namespace crucible
