// Fine-tuning (issue 18). See include/crucible/cli/fine_tuning.h.

#include "crucible/cli/fine_tuning.h"

#include "crucible/cli/commands.h"
#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <regex>

namespace crucible {

namespace {

std::string shape(const at::Tensor& t) {
  std::string s;
  for (int64_t d : t.sizes()) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

}  // namespace

LoadedModel load_init_from(const std::string& path, const std::string& model_type) {
  LoadedModel loaded;
  try {
    loaded = load_model(model_directory(path));
  } catch (const std::exception& e) {
    throw ConfigError(std::string("model.init_from: ") + e.what());
  }
  if (loaded.meta.model_type != model_type) {
    throw ConfigError("model.init_from " + path + " is a " + loaded.meta.model_type + " model; model.type must be the same, got " +
                      model_type);
  }
  return loaded;
}

void initialize_from(EnergyModel& target, const EnergyModel& source, const std::string& path,
                     const std::vector<int64_t>& new_elements) {
  auto& src = const_cast<EnergyModel&>(source).module();
  const auto src_params = src.named_parameters(/*recurse=*/true);
  std::vector<std::string> problems;
  auto dst_params = target.module().named_parameters(/*recurse=*/true);
  for (const auto& item : dst_params) {
    const at::Tensor* from = src_params.find(item.key());
    if (!from) {
      problems.push_back(item.key() + " (not in the source model)");
    } else if (from->sizes() != item.value().sizes()) {
      problems.push_back(item.key() + " " + shape(*from) + " in the source, " + shape(item.value()) + " here");
    }
  }
  for (const auto& item : src_params) {
    if (!dst_params.find(item.key())) problems.push_back(item.key() + " (only in the source model)");
  }
  if (!problems.empty()) {
    std::string list;
    for (const auto& p : problems) list += (list.empty() ? "" : "; ") + p;
    const std::string elements = element_symbols(new_elements);
    throw ConfigError("model.init_from " + path + ": " + std::to_string(problems.size()) +
                      " parameters differ from the model this config builds (" + list + ")" +
                      (elements.empty() ? std::string("; use the source run's model settings (its config.yaml)")
                                        : "; the new data has elements the source model was not trained on (" + elements +
                                              ") and this model cannot extend its element embedding"));
  }
  at::NoGradGuard no_grad;
  for (auto& item : dst_params) item.value().copy_(*src_params.find(item.key()));
}

std::set<std::string> trainable_parameters(EnergyModel& model, const std::string& pattern) {
  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw ConfigError("training.freeze must be a regular expression, got '" + pattern + "' (" + e.what() + ")");
  }
  std::set<std::string> trainable;
  std::vector<std::string> names;
  for (const auto& item : model.module().named_parameters(/*recurse=*/true)) {
    names.push_back(item.key());
    if (!std::regex_search(item.key(), re)) trainable.insert("main." + item.key());
  }
  if (trainable.empty()) {
    throw ConfigError("training.freeze '" + pattern + "' matches every parameter; nothing would be trained");
  }
  if (trainable.size() == names.size()) {
    std::string some;
    for (size_t k = 0; k < names.size() && k < 6; ++k) some += (some.empty() ? "" : ", ") + names[k];
    throw ConfigError("training.freeze '" + pattern + "' matches no parameter; names look like " + some);
  }
  return trainable;
}

}  // namespace crucible
