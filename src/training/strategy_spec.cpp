// StrategyOptions <-> JSON (seed 002 to_spec_dict / from_spec_dict).
// See include/crucible/training/strategy_spec.h.

#include "crucible/common/dtype_names.h"
#include "crucible/training/strategy_spec.h"

#include "crucible/common/error.h"

#include <nlohmann/json.hpp>

#include <set>

namespace crucible {
namespace {

using json = nlohmann::json;

template <class T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json();
}

json scheduler_to_json(const SchedulerConfig& s) {
  return {{"name", s.name},
          {"final_lr_factor", s.final_lr_factor},
          {"t_max", s.t_max},
          {"step_size", s.step_size},
          {"gamma", s.gamma},
          {"warmup", {{"steps", s.warmup.steps}, {"start_factor", s.warmup.start_factor}}},
          {"plateau",
           {{"monitor", s.plateau.monitor},
            {"factor", s.plateau.factor},
            {"patience", s.plateau.patience},
            {"threshold", s.plateau.threshold},
            {"cooldown", s.plateau.cooldown},
            {"min_lr", s.plateau.min_lr},
            {"eps", s.plateau.eps}}}};
}

json optimizer_to_json(const OptimizerConfig& o) {
  if (o.scheduler_metric) {
    throw ConfigError("optimizer config: scheduler_metric is a callable, which a spec cannot hold; "
                      "use the scheduler's plateau.monitor key instead to write a spec");
  }
  json groups = json::array();
  for (const auto& g : o.param_groups) groups.push_back({{"pattern", g.pattern}, {"options", g.options}});
  return {{"name", o.name},
          {"lr", opt(o.lr)},
          {"weight_decay", opt(o.weight_decay)},
          {"eps", opt(o.eps)},
          {"beta1", opt(o.beta1)},
          {"beta2", opt(o.beta2)},
          {"amsgrad", opt(o.amsgrad)},
          {"momentum", opt(o.momentum)},
          {"dampening", opt(o.dampening)},
          {"nesterov", opt(o.nesterov)},
          {"alpha", opt(o.alpha)},
          {"centered", opt(o.centered)},
          {"lr_decay", opt(o.lr_decay)},
          {"initial_accumulator_value", opt(o.initial_accumulator_value)},
          {"params", o.params},
          {"param_groups", groups},
          {"scheduler", o.scheduler ? scheduler_to_json(*o.scheduler) : json()}};
}

std::string validation_precision_name(ValidationPrecision p) {
  switch (p) {
    case ValidationPrecision::kAuto: return "auto";
    case ValidationPrecision::kAlways: return "always";
    case ValidationPrecision::kNever: return "never";
  }
  return "auto";
}

/// A JSON object read key by key; every key must be read (unknown = error).
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail(path_, "an object", j_);
  }
  /// Call after the last read. @throws ConfigError for a key never read.
  void done() const {
    for (const auto& [k, v] : j_.items()) {
      (void)v;
      if (read_.count(k) == 0) {
        throw ConfigError(path_ + "." + k + ": unknown key; expected one of the keys "
                          "strategy_options_to_spec writes");
      }
    }
  }
  const json& at(const std::string& key) {
    read_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end()) throw ConfigError(path_ + "." + key + ": required key, got none");
    return *it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  std::string path(const std::string& key) const { return path_ + "." + key; }
  double number(const std::string& key) {
    const json& v = at(key);
    if (!v.is_number()) fail(path(key), "a number", v);
    return v.get<double>();
  }
  int64_t integer(const std::string& key) {
    const json& v = at(key);
    if (!v.is_number_integer()) fail(path(key), "an integer", v);
    return v.get<int64_t>();
  }
  bool boolean(const std::string& key) {
    const json& v = at(key);
    if (!v.is_boolean()) fail(path(key), "true or false", v);
    return v.get<bool>();
  }
  std::string string(const std::string& key) {
    const json& v = at(key);
    if (!v.is_string()) fail(path(key), "a string", v);
    return v.get<std::string>();
  }
  std::optional<double> optional_number(const std::string& key) {
    if (at(key).is_null()) return std::nullopt;
    return number(key);
  }
  std::optional<bool> optional_boolean(const std::string& key) {
    if (at(key).is_null()) return std::nullopt;
    return boolean(key);
  }
  std::optional<int64_t> optional_integer(const std::string& key) {
    if (at(key).is_null()) return std::nullopt;
    return integer(key);
  }
  [[noreturn]] static void fail(const std::string& path, const char* expected, const json& got) {
    throw ConfigError(path + ": expected " + expected + ", got " + got.dump());
  }

 private:
  const json& j_;
  std::string path_;
  std::set<std::string> read_;
};

SchedulerConfig scheduler_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  SchedulerConfig s;
  s.name = r.string("name");
  s.final_lr_factor = r.number("final_lr_factor");
  s.t_max = r.integer("t_max");
  s.step_size = r.integer("step_size");
  s.gamma = r.number("gamma");
  {
    Reader w(r.at("warmup"), r.path("warmup"));
    s.warmup.steps = w.integer("steps");
    s.warmup.start_factor = w.number("start_factor");
    w.done();
  }
  {
    Reader p(r.at("plateau"), r.path("plateau"));
    s.plateau.monitor = p.string("monitor");
    s.plateau.factor = p.number("factor");
    s.plateau.patience = p.integer("patience");
    s.plateau.threshold = p.number("threshold");
    s.plateau.cooldown = p.integer("cooldown");
    s.plateau.min_lr = p.number("min_lr");
    s.plateau.eps = p.number("eps");
    p.done();
  }
  r.done();
  return s;
}

OptimizerConfig optimizer_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  OptimizerConfig o;
  o.name = r.string("name");
  o.lr = r.optional_number("lr");
  o.weight_decay = r.optional_number("weight_decay");
  o.eps = r.optional_number("eps");
  o.beta1 = r.optional_number("beta1");
  o.beta2 = r.optional_number("beta2");
  o.amsgrad = r.optional_boolean("amsgrad");
  o.momentum = r.optional_number("momentum");
  o.dampening = r.optional_number("dampening");
  o.nesterov = r.optional_boolean("nesterov");
  o.alpha = r.optional_number("alpha");
  o.centered = r.optional_boolean("centered");
  o.lr_decay = r.optional_number("lr_decay");
  o.initial_accumulator_value = r.optional_number("initial_accumulator_value");
  o.params = r.string("params");
  const json& groups = r.at("param_groups");
  if (!groups.is_array()) Reader::fail(r.path("param_groups"), "an array", groups);
  for (size_t i = 0; i < groups.size(); ++i) {
    Reader g(groups[i], r.path("param_groups") + "[" + std::to_string(i) + "]");
    ParamGroupConfig pg;
    pg.pattern = g.string("pattern");
    const json& options = g.at("options");
    if (!options.is_object()) Reader::fail(g.path("options"), "an object", options);
    for (const auto& [k, v] : options.items()) {
      if (!v.is_number()) Reader::fail(g.path("options") + "." + k, "a number", v);
      pg.options[k] = v.get<double>();
    }
    g.done();
    o.param_groups.push_back(pg);
  }
  if (!r.at("scheduler").is_null()) o.scheduler = scheduler_from_json(r.at("scheduler"), r.path("scheduler"));
  r.done();
  return o;
}

constexpr std::initializer_list<at::ScalarType> kSpecDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

at::ScalarType spec_dtype(const std::string& name, const std::string& path) {
  if (const auto t = dtype_from_name(name, kSpecDtypes)) return *t;
  throw ConfigError(path + ": expected " + dtype_choices(kSpecDtypes) + ", got \"" + name + "\"");
}

}  // namespace

std::string strategy_options_to_spec(const StrategyOptions& o) {
  json configs = json::object();
  for (const auto& [model, list] : o.optimizer_configs) {
    json arr = json::array();
    for (const auto& c : list) arr.push_back(optimizer_to_json(c));
    configs[model] = arr;
  }
  json validation;
  if (o.validation) {
    const auto& v = *o.validation;
    validation = {{"every_n_epochs", v.every_n_epochs},
                  {"every_n_steps", v.every_n_steps},
                  {"batch_size", v.batch_size},
                  {"use_ema", v.use_ema},
                  {"use_mixed_precision", validation_precision_name(v.use_mixed_precision)},
                  {"compute_loss", v.compute_loss}};
  }
  const json spec = {{"spec_version", kStrategySpecVersion},
                     {"num_epochs", opt(o.num_epochs)},
                     {"num_steps", opt(o.num_steps)},
                     {"epoch_step_modifier", o.epoch_step_modifier},
                     {"optimizer", optimizer_to_json(o.optimizer)},
                     {"optimizer_configs", configs},
                     {"dtype", dtype_name(o.dtype)},
                     {"precision", o.precision},
                     {"precision_plugin", o.precision_plugin != nullptr},
                     {"validation", validation},
                     {"stop_on_non_finite", o.stop_on_non_finite},
                     {"max_batches_without_step", o.max_batches_without_step},
                     {"bucket_cap_mb", o.bucket_cap_mb}};
  return spec.dump(2);
}

StrategyOptions strategy_options_from_spec(const std::string& spec_json, const StrategyOptions& runtime) {
  json j;
  try {
    j = json::parse(spec_json);
  } catch (const json::exception& e) {
    throw ConfigError(std::string("spec: must be JSON, got unparsable text (") + e.what() + ")");
  }
  StrategyOptions o = runtime;
  try {
    Reader r(j, "spec");
    if (r.integer("spec_version") != kStrategySpecVersion) {
      throw ConfigError("spec.spec_version: expected " + std::to_string(kStrategySpecVersion) +
                        ", got " + r.at("spec_version").dump());
    }
    o.num_epochs = r.optional_integer("num_epochs");
    o.num_steps = r.optional_integer("num_steps");
    o.epoch_step_modifier = r.number("epoch_step_modifier");
    o.optimizer = optimizer_from_json(r.at("optimizer"), r.path("optimizer"));
    const json& configs = r.at("optimizer_configs");
    if (!configs.is_object()) Reader::fail(r.path("optimizer_configs"), "an object", configs);
    o.optimizer_configs.clear();
    for (const auto& [model, list] : configs.items()) {
      const std::string path = r.path("optimizer_configs") + "." + model;
      if (!list.is_array()) Reader::fail(path, "an array", list);
      for (size_t i = 0; i < list.size(); ++i) {
        o.optimizer_configs[model].push_back(
            optimizer_from_json(list[i], path + "[" + std::to_string(i) + "]"));
      }
    }
    o.dtype = spec_dtype(r.string("dtype"), r.path("dtype"));
    o.precision = r.string("precision");
    if (r.boolean("precision_plugin") && !runtime.precision_plugin) {
      throw ConfigError("spec.precision_plugin: the spec was written with a precision plugin "
                        "object; pass it again as runtime.precision_plugin");
    }
    const json& v = r.at("validation");
    if (v.is_null()) {
      o.validation.reset();
    } else {
      if (!runtime.validation) {
        throw ConfigError("spec.validation: the spec has a validation cadence; pass the "
                          "validation data as runtime.validation");
      }
      Reader vr(v, r.path("validation"));
      o.validation->every_n_epochs = vr.integer("every_n_epochs");
      o.validation->every_n_steps = vr.integer("every_n_steps");
      o.validation->batch_size = vr.integer("batch_size");
      o.validation->use_ema = vr.boolean("use_ema");
      o.validation->use_mixed_precision = parse_validation_precision(vr.string("use_mixed_precision"));
      o.validation->compute_loss = vr.boolean("compute_loss");
      vr.done();
    }
    o.stop_on_non_finite = r.boolean("stop_on_non_finite");
    o.max_batches_without_step = r.integer("max_batches_without_step");
    o.bucket_cap_mb = r.number("bucket_cap_mb");
    r.done();
  } catch (const json::exception& e) {
    throw ConfigError(std::string("spec: ") + e.what());
  }
  return o;
}

}  // namespace crucible
