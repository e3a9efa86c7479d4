#include "crucible/training/optimizers.h"

#include "crucible/common/error.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <regex>
#include <sstream>

namespace crucible {

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// Range of one option; `boolean` options take 0 / 1 in group overrides.
struct OptionSpec {
  const char* name;
  const char* expected;
  std::function<bool(double)> ok;
  bool boolean = false;
};

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> specs = {
      {"lr", "a finite number > 0", [](double v) { return std::isfinite(v) && v > 0; }},
      {"weight_decay", "a finite number >= 0", [](double v) { return std::isfinite(v) && v >= 0; }},
      {"eps", "a finite number > 0", [](double v) { return std::isfinite(v) && v > 0; }},
      {"beta1", "in [0, 1)", [](double v) { return v >= 0 && v < 1; }},
      {"beta2", "in [0, 1)", [](double v) { return v >= 0 && v < 1; }},
      {"amsgrad", "0 or 1 (false or true)", [](double v) { return v == 0 || v == 1; }, true},
      {"momentum", "a finite number >= 0", [](double v) { return std::isfinite(v) && v >= 0; }},
      {"dampening", "a finite number >= 0", [](double v) { return std::isfinite(v) && v >= 0; }},
      {"nesterov", "0 or 1 (false or true)", [](double v) { return v == 0 || v == 1; }, true},
      {"alpha", "in [0, 1)", [](double v) { return v >= 0 && v < 1; }},
      {"centered", "0 or 1 (false or true)", [](double v) { return v == 0 || v == 1; }, true},
      {"lr_decay", "a finite number >= 0", [](double v) { return std::isfinite(v) && v >= 0; }},
      {"initial_accumulator_value", "a finite number >= 0",
       [](double v) { return std::isfinite(v) && v >= 0; }},
  };
  return specs;
}

const OptionSpec& spec(const std::string& name) {
  for (const auto& s : option_specs()) {
    if (name == s.name) return s;
  }
  throw std::logic_error("no option spec for " + name);
}

/// Every option value of one optimizer (defaults resolved), by name.
using Values = std::map<std::string, double>;

Values defaults(const std::string& name) {
  if (name == "adam" || name == "adamw") {
    return {{"lr", 1e-3},   {"weight_decay", name == "adamw" ? 1e-2 : 0.0},
            {"eps", 1e-8},  {"beta1", 0.9},
            {"beta2", 0.999}, {"amsgrad", 0}};
  }
  if (name == "sgd") {
    return {{"momentum", 0}, {"dampening", 0}, {"weight_decay", 0}, {"nesterov", 0}};
  }
  if (name == "rmsprop") {
    return {{"lr", 1e-2},       {"alpha", 0.99}, {"eps", 1e-8},
            {"weight_decay", 0}, {"momentum", 0}, {"centered", 0}};
  }
  if (name == "adagrad") {
    return {{"lr", 1e-2},
            {"lr_decay", 0},
            {"weight_decay", 0},
            {"initial_accumulator_value", 0},
            {"eps", 1e-10}};
  }
  throw ConfigError("no defaults for optimizer " + name);
}

/// The optional fields of `c` that are set, by option name.
Values set_fields(const OptimizerConfig& c) {
  Values v;
  auto put = [&](const char* n, const auto& opt) {
    if (opt) v[n] = static_cast<double>(*opt);
  };
  put("lr", c.lr);
  put("weight_decay", c.weight_decay);
  put("eps", c.eps);
  put("beta1", c.beta1);
  put("beta2", c.beta2);
  put("amsgrad", c.amsgrad);
  put("momentum", c.momentum);
  put("dampening", c.dampening);
  put("nesterov", c.nesterov);
  put("alpha", c.alpha);
  put("centered", c.centered);
  put("lr_decay", c.lr_decay);
  put("initial_accumulator_value", c.initial_accumulator_value);
  return v;
}

/// Checks the ranges of option values (names already known to the optimizer).
void check_ranges(const Values& v, const std::string& path) {
  for (const auto& [name, value] : v) {
    const OptionSpec& s = spec(name);
    if (!s.ok(value)) {
      throw ConfigError(path + "." + name + " must be " + s.expected + ", got " + num(value));
    }
  }
}

/// Checks rules between options on fully resolved values.
void check_combination(const std::string& optimizer, const Values& v, const std::string& path) {
  if (optimizer != "sgd") return;
  if (v.count("lr") == 0) {
    throw ConfigError(path + ".lr must be set for sgd (PyTorch's SGD has no default lr), got "
                      "none");
  }
  if (v.at("nesterov") == 1 && !(v.at("momentum") > 0 && v.at("dampening") == 0)) {
    throw ConfigError(path + ".nesterov needs momentum > 0 and dampening 0, got momentum " +
                      num(v.at("momentum")) + " and dampening " + num(v.at("dampening")));
  }
}

Values resolve(const OptimizerConfig& c) {
  Values v = defaults(c.name);
  for (const auto& [k, x] : set_fields(c)) v[k] = x;
  return v;
}

std::unique_ptr<torch::optim::OptimizerOptions> make_options(const std::string& name,
                                                             const Values& v) {
  if (name == "adam") {
    auto o = std::make_unique<torch::optim::AdamOptions>(v.at("lr"));
    o->betas({v.at("beta1"), v.at("beta2")}).eps(v.at("eps")).weight_decay(v.at("weight_decay"));
    o->amsgrad(v.at("amsgrad") != 0);
    return o;
  }
  if (name == "adamw") {
    auto o = std::make_unique<torch::optim::AdamWOptions>(v.at("lr"));
    o->betas({v.at("beta1"), v.at("beta2")}).eps(v.at("eps")).weight_decay(v.at("weight_decay"));
    o->amsgrad(v.at("amsgrad") != 0);
    return o;
  }
  if (name == "sgd") {
    auto o = std::make_unique<torch::optim::SGDOptions>(v.at("lr"));
    o->momentum(v.at("momentum")).dampening(v.at("dampening"));
    o->weight_decay(v.at("weight_decay")).nesterov(v.at("nesterov") != 0);
    return o;
  }
  if (name == "rmsprop") {
    auto o = std::make_unique<torch::optim::RMSpropOptions>(v.at("lr"));
    o->alpha(v.at("alpha")).eps(v.at("eps")).weight_decay(v.at("weight_decay"));
    o->momentum(v.at("momentum")).centered(v.at("centered") != 0);
    return o;
  }
  auto o = std::make_unique<torch::optim::AdagradOptions>(v.at("lr"));
  o->lr_decay(v.at("lr_decay")).weight_decay(v.at("weight_decay"));
  o->initial_accumulator_value(v.at("initial_accumulator_value")).eps(v.at("eps"));
  return o;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer_from_groups(
    const std::string& name, std::vector<torch::optim::OptimizerParamGroup> groups,
    const Values& defaults_values) {
  if (name == "adam") {
    return std::make_unique<torch::optim::Adam>(
        std::move(groups),
        *static_cast<torch::optim::AdamOptions*>(make_options(name, defaults_values).get()));
  }
  if (name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        std::move(groups),
        *static_cast<torch::optim::AdamWOptions*>(make_options(name, defaults_values).get()));
  }
  if (name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        std::move(groups),
        *static_cast<torch::optim::SGDOptions*>(make_options(name, defaults_values).get()));
  }
  if (name == "rmsprop") {
    return std::make_unique<torch::optim::RMSprop>(
        std::move(groups),
        *static_cast<torch::optim::RMSpropOptions*>(make_options(name, defaults_values).get()));
  }
  return std::make_unique<torch::optim::Adagrad>(
      std::move(groups),
      *static_cast<torch::optim::AdagradOptions*>(make_options(name, defaults_values).get()));
}

std::regex compile(const std::string& pattern, const std::string& path) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ConfigError(path + " must be a valid regular expression, got '" + pattern + "' (" +
                      e.what() + ")");
  }
}

}  // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"adam", "adamw", "sgd", "rmsprop", "adagrad"};
  return names;
}

const std::vector<std::string>& optimizer_option_names(const std::string& name) {
  static const std::map<std::string, std::vector<std::string>> table = {
      {"adam", {"lr", "weight_decay", "eps", "beta1", "beta2", "amsgrad"}},
      {"adamw", {"lr", "weight_decay", "eps", "beta1", "beta2", "amsgrad"}},
      {"sgd", {"lr", "weight_decay", "momentum", "dampening", "nesterov"}},
      {"rmsprop", {"lr", "weight_decay", "eps", "alpha", "momentum", "centered"}},
      {"adagrad", {"lr", "weight_decay", "eps", "lr_decay", "initial_accumulator_value"}},
  };
  auto it = table.find(name);
  if (it == table.end()) {
    throw ConfigError("optimizer name must be one of " + join(optimizer_names()) + ", got '" +
                      name + "'");
  }
  return it->second;
}

void check_optimizer_config(const OptimizerConfig& c, const std::string& path) {
  const auto& known = [&]() -> const std::vector<std::string>& {
    try {
      return optimizer_option_names(c.name);
    } catch (const ConfigError&) {
      throw ConfigError(path + ".name must be one of " + join(optimizer_names()) + ", got '" +
                        c.name + "'");
    }
  }();
  auto has = [&](const std::string& o) {
    return std::find(known.begin(), known.end(), o) != known.end();
  };
  for (const auto& [name, value] : set_fields(c)) {
    (void)value;
    if (!has(name)) {
      throw ConfigError(path + "." + name + " is not an option of " + c.name + " (its options: " +
                        join(known) + ")");
    }
  }
  check_ranges(set_fields(c), path);
  const Values resolved = resolve(c);
  check_combination(c.name, resolved, path);
  if (!c.params.empty()) compile(c.params, path + ".params");
  for (size_t g = 0; g < c.param_groups.size(); ++g) {
    const auto& group = c.param_groups[g];
    const std::string gp = path + ".param_groups[" + std::to_string(g) + "]";
    if (group.pattern.empty()) {
      throw ConfigError(gp + ".pattern must be a non-empty regular expression, got \"\"");
    }
    compile(group.pattern, gp + ".pattern");
    for (const auto& [name, value] : group.options) {
      if (!has(name)) {
        throw ConfigError(gp + "." + name + " is not an option of " + c.name + " (its options: " +
                          join(known) + ")");
      }
    }
    check_ranges(group.options, gp);
    Values merged = resolved;
    for (const auto& [k, x] : group.options) merged[k] = x;
    check_combination(c.name, merged, gp);
  }
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const OptimizerConfig& c, const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const std::string& path) {
  check_optimizer_config(c, path);
  if (named_params.empty()) {
    throw ConfigError(path + " must receive at least one trainable parameter, got none" +
                      (c.params.empty() ? std::string() : " matching params '" + c.params + "'"));
  }
  const Values base = resolve(c);
  std::vector<std::regex> patterns;
  for (size_t g = 0; g < c.param_groups.size(); ++g) {
    patterns.push_back(compile(c.param_groups[g].pattern,
                               path + ".param_groups[" + std::to_string(g) + "].pattern"));
  }
  std::vector<std::vector<at::Tensor>> members(c.param_groups.size() + 1);
  for (const auto& [name, p] : named_params) {
    size_t g = 0;
    while (g < patterns.size() && !std::regex_search(name, patterns[g])) ++g;
    members[g].push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < c.param_groups.size(); ++g) {
    if (members[g].empty()) {
      throw ConfigError(path + ".param_groups[" + std::to_string(g) + "].pattern '" +
                        c.param_groups[g].pattern + "' must match at least one parameter, got "
                        "none (check the parameter names)");
    }
    Values v = base;
    for (const auto& [k, x] : c.param_groups[g].options) v[k] = x;
    groups.emplace_back(members[g], make_options(c.name, v));
  }
  if (!members.back().empty()) groups.emplace_back(members.back(), make_options(c.name, base));
  return make_optimizer_from_groups(c.name, std::move(groups), base);
}

}  // namespace crucible
