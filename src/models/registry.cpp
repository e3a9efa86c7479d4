// The model registry. See include/crucible/models/registry.h.

#include "crucible/models/registry.h"

#include <stdexcept>

namespace crucible {
namespace {

template <class T>
T get(const ModelBuildContext& ctx, const std::string& name, const char* what) {
  const std::string key = ctx.type + "." + name;
  if (!ctx.params) throw std::invalid_argument("model." + key + ": no model parameters given");
  auto it = ctx.params->find(key);
  if (it == ctx.params->end()) throw std::invalid_argument("model." + key + ": not set");
  if (!std::holds_alternative<T>(it->second)) throw std::invalid_argument("model." + key + " must be " + what);
  return std::get<T>(it->second);
}

}  // namespace

int64_t ModelBuildContext::get_int(const std::string& name) const { return get<int64_t>(*this, name, "an integer"); }
double ModelBuildContext::get_float(const std::string& name) const { return get<double>(*this, name, "a number"); }
bool ModelBuildContext::get_bool(const std::string& name) const { return get<bool>(*this, name, "a boolean"); }
std::string ModelBuildContext::get_string(const std::string& name) const {
  return get<std::string>(*this, name, "a string");
}
std::vector<int64_t> ModelBuildContext::get_int_list(const std::string& name) const {
  return get<std::vector<int64_t>>(*this, name, "a list of integers");
}

const std::vector<ModelFactory>& model_registry() {
  static const std::vector<ModelFactory> registry = builtin_models();
  return registry;
}

const ModelFactory& model_factory(const std::string& type) {
  std::string names;
  for (const auto& f : model_registry()) {
    if (f.type == type) return f;
    names += (names.empty() ? "" : ", ") + f.type;
  }
  throw std::invalid_argument("model.type must be one of " + names + ", got '" + type + "'");
}

ModelParams default_model_params() {
  ModelParams p;
  for (const auto& f : model_registry())
    for (const auto& k : f.keys) p[f.type + "." + k.name] = k.default_value;
  return p;
}

}  // namespace crucible
