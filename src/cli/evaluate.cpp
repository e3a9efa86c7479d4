// `crucible evaluate`: error metrics of a trained model on an extxyz file.

#include "crucible/cli/commands.h"
#include "crucible/cli/training_setup.h"
#include "crucible/cli/model_io.h"
#include "crucible/common/error.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/data/structure_checks.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <set>

namespace crucible {

namespace {

std::string metric(double v, int64_t n, const char* unit, int precision = 2) {
  if (n == 0 || !std::isfinite(v)) return "n/a";
  return fmt::format("{:.{}f} {}", v, precision, unit);
}

}  // namespace

ValidationSummary run_evaluation(const EvaluateRequest& req, std::ostream& out, std::ostream& err) {
  if (req.batch_size < 1) {
    throw ConfigError("--batch-size must be >= 1, got " + std::to_string(req.batch_size));
  }
  for (const auto& o : req.overrides) {
    if (o.rfind("data.", 0) != 0) {
      throw ConfigError("evaluate accepts only data.* overrides (keys and units), got '" + o + "'");
    }
  }
  at::Device device(at::kCPU);
  try {
    device = at::Device(req.device);
  } catch (const c10::Error&) {
    throw ConfigError("--device must be cpu, cuda or cuda:N, got '" + req.device + "'");
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    throw ConfigError("--device must be cpu on this build (LibTorch without CUDA), got '" +
                      req.device + "'");
  }

  LoadedModel loaded = load_model(req.model_dir);
  Config config = default_config();
  config.data = loaded.meta.data;  // keys and units the model was trained with
  apply_overrides(config, req.overrides);
  const DataConfig& d = config.data;

  const std::string path = resolve_data_path(req.data_file, "--data");
  std::vector<Structure> structures = read_extxyz(path, extxyz_options(d));
  check_structures(structures, "--data");
  if (structures.empty()) {
    throw DataError(path + ": --data must contain at least one structure, got none");
  }
  int64_t atoms = 0;
  std::set<int64_t> zs;
  for (const auto& s : structures) {
    atoms += s.num_atoms();
    auto z = s.atomic_numbers.contiguous();
    for (int64_t i = 0; i < z.numel(); ++i) zs.insert(z.data_ptr<int64_t>()[i]);
  }
  const std::set<int64_t> known(loaded.meta.atomic_numbers.begin(),
                                loaded.meta.atomic_numbers.end());
  std::string unseen, elements;
  for (int64_t z : zs) {
    if (!known.empty() && !known.count(z)) unseen += " " + chemical_symbol(z);
  }
  for (int64_t z : loaded.meta.atomic_numbers) elements += " " + chemical_symbol(z);
  if (!unseen.empty()) {
    err << "crucible: warning: " << path << " contains elements the model was not trained on:"
        << unseen << "; their predictions are meaningless\n";
  }

  const double cutoff = loaded.model->cutoff();
  AtomicDataset dataset(std::move(structures), cutoff);
  EvaluateOptions eo;
  eo.batch_size = req.batch_size;
  eo.stress = true;
  eo.dtype = loaded.meta.dtype == "float64" ? at::kDouble : at::kFloat;
  loaded.model->module().to(device);
  const ValidationSummary v = evaluate_model(*loaded.model, dataset, device, eo);

  out << fmt::format("model      {} ({}, {}, cutoff {} Å, elements{})\n", req.model_dir,
                     loaded.meta.model_type, loaded.meta.dtype, cutoff, elements);
  out << fmt::format("data       {}: {} structures, {} atoms\n", path, dataset.size(), atoms);
  out << fmt::format("units      energy {}, forces {}, stress {}\n", d.energy_unit.to_string(),
                     d.forces_unit.to_string(), d.stress_unit.to_string());
  out << fmt::format("structures {}\n", v.num_structures);
  out << fmt::format("energy     MAE {:>16}   RMSE {:>16}   ({} structures)\n",
                     metric(v.energy_mae, v.num_energies, "meV/atom"),
                     metric(v.energy_rmse, v.num_energies, "meV/atom"), v.num_energies);
  out << fmt::format("forces     MAE {:>16}   RMSE {:>16}   ({} components)\n",
                     metric(v.forces_mae, v.num_forces, "meV/Å"),
                     metric(v.forces_rmse, v.num_forces, "meV/Å"), v.num_forces);
  if (v.num_stresses > 0) {
    out << fmt::format("stress     MAE {:>16}   RMSE {:>16}   ({} components)\n",
                       metric(v.stress_mae, v.num_stresses, "meV/Å³", 3),
                       metric(v.stress_rmse, v.num_stresses, "meV/Å³", 3), v.num_stresses);
  }
  if (v.num_forces > 0) {
    out << fmt::format("zero-forces baseline MAE {:.2f} meV/Å; model/baseline = {:.3f}\n",
                       v.zero_forces_mae, v.forces_mae / v.zero_forces_mae);
  }
  out.flush();

  if (req.json_path) {
    nlohmann::json j;
    for (const auto& [k, val] : v.as_map()) {
      j[k] = std::isfinite(val) ? nlohmann::json(val) : nlohmann::json();
    }
    j["num_structures"] = v.num_structures;
    j["num_energies"] = v.num_energies;
    j["num_forces"] = v.num_forces;
    j["num_stresses"] = v.num_stresses;
    j["data"] = path;
    j["model"] = req.model_dir;
    std::ofstream f(*req.json_path);
    if (!f) throw DataError(*req.json_path + ": --json file cannot be created");
    f << j.dump(2) << "\n";
  }
  return v;
}

}  // namespace crucible
