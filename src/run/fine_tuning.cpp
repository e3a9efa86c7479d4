// Fine-tuning (issue 18). See include/crucible/run/fine_tuning.h.

#include "crucible/run/fine_tuning.h"

#include "crucible/run/data_paths.h"
#include "crucible/common/dtype_names.h"
#include "crucible/common/error.h"
#include "crucible/data/batch.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/mace/mace_import.h"
#include "crucible/models/registry.h"
#include "crucible/neighbors/neighbor_list.h"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <regex>

namespace crucible {

namespace {

std::string shape(const at::Tensor& t) {
  std::string s;
  for (int64_t d : t.sizes()) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

std::string param_text(const ModelParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) return x;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          std::string s;
          for (int64_t k : x) s += (s.empty() ? "" : ", ") + std::to_string(k);
          return "[" + s + "]";
        }
        if constexpr (std::is_same_v<T, double>) return fmt::format("{}", x);
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(x);
      },
      v);
}

}  // namespace

/// A MACE file rather than a Crucible model: a .model or a .pt that is not
/// a run's model.pt (with model.json beside it).
bool is_mace_file(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (fs::is_directory(p)) return false;
  if (p.filename() == "model.pt" && fs::exists(p.parent_path() / "model.json")) return false;
  return p.extension() == ".model" || p.extension() == ".pt";
}

LoadedModel load_mace_file(const std::string& path) {
  namespace fs = std::filesystem;
  MaceFile file;
  if (fs::path(path).extension() == ".pt") {
    const fs::path json = fs::path(path).replace_extension(".json");
    if (!fs::exists(json)) {
      throw DataError(path + ": a MACE .pt needs its hyper-parameters beside it as " + json.string() +
                      " (python3 -m crucible.mace_to_pt writes both)");
    }
    file = read_mace_state_dict(path, json.string());
  } else {
    file = read_mace_torchscript(path);
  }
  ImportedMace imp = import_mace(file);
  LoadedModel out;
  out.model = imp.model;
  out.meta = imported_metadata(imp);
  return out;
}

LoadedModel load_init_from(const std::string& path, const std::string& model_type) {
  LoadedModel loaded;
  try {
    loaded = is_mace_file(path) ? load_mace_file(path) : load_model(path);
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

ModelMetadata imported_metadata(const ImportedMace& imported) {
  ModelMetadata meta;
  meta.model_type = "mace";
  meta.hyperparameters = model_factory("mace").to_json(*imported.model);
  meta.dtype = dtype_name(imported.dtype);
  meta.atomic_numbers = imported.model->elements();
  meta.e0 = imported.e0;
  meta.e0_source = "MACE file";
  meta.scale = imported.scale;
  meta.shift = imported.shift;
  meta.origin = imported.origin;
  return meta;
}

bool is_imported_model(const EnergyModel& model) {
  const auto* mace = dynamic_cast<const MaceImpl*>(&model);
  return mace && mace->mace_basis();
}

std::shared_ptr<EnergyModel> copy_of_imported_model(const LoadedModel& source, const ModelConfig& config,
                                                    const ModelConfig& defaults, const std::set<int64_t>& elements,
                                                    const std::string& path) {
  const auto& mace = dynamic_cast<const MaceImpl&>(*source.model);
  std::vector<int64_t> missing;
  const std::vector<int64_t> own = mace.elements();
  for (int64_t z : elements)
    if (std::find(own.begin(), own.end(), z) == own.end()) missing.push_back(z);
  if (!missing.empty()) {
    throw ConfigError("model.init_from " + path + ": the imported model has no " + element_symbols(missing) +
                      " (its elements: " + element_symbols(own) +
                      "); an imported MACE model cannot grow its element list: fine-tune it on data of its elements");
  }
  // The architecture is the source's: a key set to another value is refused.
  const MaceOptions& o = mace.options();
  if (config.cutoff != defaults.cutoff && config.cutoff != o.cutoff) {
    throw ConfigError(fmt::format("model.cutoff = {} differs from the cutoff of model.init_from {} ({} Å); the "
                                  "architecture comes from the source: remove model.cutoff", config.cutoff, path, o.cutoff));
  }
  const std::map<std::string, ModelParamValue> source_values = {
      {"mace.hidden_irreps", o.hidden_irreps},
      {"mace.max_ell", static_cast<int64_t>(o.max_ell)},
      {"mace.correlation", static_cast<int64_t>(o.correlation)},
      {"mace.num_interactions", o.num_interactions},
      {"mace.num_bessel", o.num_bessel},
      {"mace.num_polynomial_cutoff", o.num_polynomial_cutoff},
      {"mace.radial_mlp", o.radial_mlp},
      {"mace.mlp_irreps", std::to_string(o.readout_mlp) + "x0e"},
      {"mace.avg_num_neighbors", o.avg_num_neighbors},
      {"mace.pair_repulsion", o.pair_repulsion}};
  for (const auto& [key, value] : source_values) {
    auto set = config.params.find(key);
    auto dflt = defaults.params.find(key);
    if (set == config.params.end() || dflt == defaults.params.end()) continue;
    if (set->second != dflt->second && set->second != value) {
      throw ConfigError("model." + key + " = " + param_text(set->second) + " differs from model.init_from " + path + " (" +
                        param_text(value) + "); the architecture comes from the source: remove model." + key);
    }
  }
  return source.model->clone_model();
}

E0Choice source_e0s(const E0Setting& setting, const LoadedModel& source, const std::vector<Structure>& train,
                    const std::set<int64_t>& elements) {
  E0Choice c;
  c.e0 = at::zeros({119}, at::kDouble);
  std::vector<int64_t> missing;
  for (int64_t z : elements) {
    auto it = source.meta.e0.find(z);
    if (it == source.meta.e0.end()) missing.push_back(z);
    else c.e0[z] = it->second;
  }
  if (!missing.empty()) {
    throw ConfigError("data.e0s " + setting.mode + ": the source model has no E0 for " + element_symbols(missing) +
                      "; give them as a map, e.g. {" + chemical_symbol(missing[0]) + ": -1.0}");
  }
  if (setting.mode == "foundation") {
    c.source = "foundation (the source model's E0s)";
    return c;
  }
  // estimated: the source's energy errors on the training data, fitted per element.
  std::shared_ptr<EnergyModel> model = source.model->clone_model();
  model->module().to(at::kDouble);
  model->module().eval();
  std::vector<int64_t> zs(elements.begin(), elements.end());
  std::vector<double> residual;
  std::vector<at::Tensor> rows;
  for (const auto& s : train) {
    if (!s.energy) continue;
    const NeighborList nl = build_neighbor_list(s.positions, s.cell, s.pbc, model->cutoff());
    const Batch batch = collate({&s}, {&nl});
    ComputeOptions co;
    co.forces = false;
    const double predicted = compute_outputs(*model, batch, co).energy[0].item<double>();
    residual.push_back(*s.energy - predicted);
    at::Tensor row = at::zeros({static_cast<int64_t>(zs.size())}, at::kDouble);
    for (size_t k = 0; k < zs.size(); ++k) row[static_cast<int64_t>(k)] = s.atomic_numbers.eq(zs[k]).sum().item<double>();
    rows.push_back(row);
  }
  if (rows.empty()) {
    c.source = "estimated: the source model's E0s (no training energies to correct them)";
    return c;
  }
  const at::Tensor A = at::stack(rows), b = at::tensor(residual, at::kDouble).unsqueeze(1);
  const at::Tensor delta = std::get<0>(at::linalg_lstsq(A, b, c10::nullopt, std::string("gelsd"))).squeeze(1);
  // MACE's statistics (mace/data/utils.py estimate_e0s_from_foundation):
  // the total-energy RMSE, which the least-squares fit cannot increase.
  const at::Tensor left = b.squeeze(1) - at::matmul(A, delta);
  const double before = b.pow(2).mean().sqrt().item<double>(), after = left.pow(2).mean().sqrt().item<double>();
  for (size_t k = 0; k < zs.size(); ++k) c.e0[zs[k]] += delta[static_cast<int64_t>(k)].item<double>();
  c.source = fmt::format("estimated: the source model's E0s corrected on {} training energies, its energy RMSE "
                         "{:.4g} -> {:.4g} eV per structure", residual.size(), before, after);
  return c;
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
