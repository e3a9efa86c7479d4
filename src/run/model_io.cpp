// model.pt (LibTorch archive) + model.json (metadata) of a trained model.

#include "crucible/common/dtype_names.h"
#include "crucible/run/model_io.h"
#include "crucible/run/run_dir.h"

#include "crucible/checkpoint/tensor_archive.h"
#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/registry.h"

#include <nlohmann/json.hpp>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace crucible {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "crucible-model";
constexpr int kVersion = 1;

json unit_json(const UnitSetting& u) {
  if (u.name.empty()) return u.factor;
  return u.name;
}

UnitSetting unit_from_json(const json& j, UnitQuantity q) {
  if (j.is_number()) return UnitSetting{"", j.get<double>()};
  const std::string name = j.get<std::string>();
  const auto f = named_unit_factor(q, name);
  if (!f) throw DataError("unknown unit '" + name + "'");
  return UnitSetting{name, *f};
}

}  // namespace

void save_model_weights(const std::string& file, EnergyModel& model) {
  model.module().to(at::kCPU);
  const fs::path pt(file);
  const fs::path pt_tmp = pt.string() + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    model.module().save(archive);
    archive.save_to(pt_tmp.string());
  } catch (const c10::Error& e) {
    throw DataError(pt.string() + ": cannot be written: " + e.what_without_backtrace());
  }
  std::error_code ec;
  fs::rename(pt_tmp, pt, ec);
  if (ec) throw DataError(pt.string() + ": cannot be written (" + ec.message() + ")");
}

void save_model(const std::string& run_dir, EnergyModel& model, const ModelMetadata& meta) {
  const fs::path dir(run_dir);
  save_model_weights((dir / "model.pt").string(), model);

  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["model_type"] = meta.model_type;
  j["hyperparameters"] = meta.hyperparameters.is_null() ? model_factory(meta.model_type).to_json(model)
                                                        : meta.hyperparameters;
  j["dtype"] = meta.dtype;
  j["cutoff_angstrom"] = model.cutoff();
  json elements = json::array(), zs = json::array(), e0 = json::object();
  for (int64_t z : meta.atomic_numbers) {
    elements.push_back(chemical_symbol(z));
    zs.push_back(z);
  }
  for (const auto& [z, v] : meta.e0) e0[chemical_symbol(z)] = v;
  j["elements"] = elements;
  j["atomic_numbers"] = zs;
  j["e0_eV"] = e0;
  if (!meta.e0_source.empty()) j["e0_source"] = meta.e0_source;
  j["scale_eV"] = meta.scale;
  j["shift_eV_per_atom"] = meta.shift;
  if (meta.min_distance) j["min_distance_angstrom"] = *meta.min_distance;
  if (!meta.origin.is_null()) j["origin"] = meta.origin;
  j["output_units"] = {{"energy", "eV"}, {"forces", "eV/Å"}, {"stress", "eV/Å^3"},
                       {"length", "Å"}};
  const auto& d = meta.data;
  j["data"] = {{"energy_key", d.energy_key},
               {"forces_key", d.forces_key},
               {"stress_key", d.stress_key},
               {"virial_key", d.virial_key},
               {"energy_unit", unit_json(d.energy_unit)},
               {"forces_unit", unit_json(d.forces_unit)},
               {"stress_unit", unit_json(d.stress_unit)},
               {"train_file", d.train_file}};
  write_file_atomically(dir / "model.json", j.dump(2) + "\n");
}

LoadedModel load_model(const std::string& path) {
  // A weights file (model_last.pt) takes the model.json beside it.
  const bool weights_file = fs::is_regular_file(path) && fs::path(path).extension() == ".pt";
  const fs::path dir = weights_file ? fs::path(path).parent_path() : fs::path(path);
  const std::string run_dir = dir.empty() ? std::string(".") : dir.string();
  const fs::path json_path = dir / "model.json";
  const fs::path pt = weights_file ? fs::path(path) : dir / "model.pt";
  if (!fs::is_directory(dir)) {
    throw DataError(run_dir + ": model directory does not exist (expected a run directory with "
                              "model.json and model.pt)");
  }
  std::ifstream in(json_path);
  if (!in) throw DataError(json_path.string() + ": cannot be opened (not a finished run?)");
  LoadedModel out;
  ModelMetadata& meta = out.meta;
  try {
    json j = json::parse(in);
    if (j.value("format", "") != kFormat) {
      throw DataError(json_path.string() + ": format must be \"" + kFormat + "\", got " +
                      j.value("format", json()).dump());
    }
    const int version = j.at("version").get<int>();
    if (version != kVersion) {
      throw DataError(json_path.string() + ": version must be " + std::to_string(kVersion) +
                      ", got " + std::to_string(version));
    }
    meta.model_type = j.at("model_type").get<std::string>();
    try {
      model_factory(meta.model_type);
    } catch (const std::invalid_argument& e) {
      throw DataError(json_path.string() + ": model_type " + e.what());
    }
    meta.hyperparameters = j.at("hyperparameters");
    meta.dtype = j.at("dtype").get<std::string>();
    if (!dtype_from_name(meta.dtype)) {
      throw DataError(json_path.string() + ": dtype must be " + dtype_choices() + ", got \"" + meta.dtype + "\"");
    }
    for (const auto& z : j.at("atomic_numbers")) meta.atomic_numbers.push_back(z.get<int64_t>());
    for (const auto& [sym, v] : j.at("e0_eV").items()) meta.e0[atomic_number(sym)] = v.get<double>();
    meta.scale = j.at("scale_eV").get<double>();
    meta.shift = j.at("shift_eV_per_atom").get<double>();
    if (j.contains("e0_source")) meta.e0_source = j.at("e0_source").get<std::string>();
    if (j.contains("min_distance_angstrom")) meta.min_distance = j.at("min_distance_angstrom").get<double>();
    if (j.contains("origin")) meta.origin = j.at("origin");
    if (j.contains("data")) {
      const auto& d = j.at("data");
      meta.data.energy_key = d.value("energy_key", meta.data.energy_key);
      meta.data.forces_key = d.value("forces_key", meta.data.forces_key);
      meta.data.stress_key = d.value("stress_key", meta.data.stress_key);
      meta.data.virial_key = d.value("virial_key", meta.data.virial_key);
      meta.data.train_file = d.value("train_file", meta.data.train_file);
      if (d.contains("energy_unit")) {
        meta.data.energy_unit = unit_from_json(d.at("energy_unit"), UnitQuantity::kEnergy);
      }
      if (d.contains("forces_unit")) {
        meta.data.forces_unit = unit_from_json(d.at("forces_unit"), UnitQuantity::kForces);
      }
      if (d.contains("stress_unit")) {
        meta.data.stress_unit = unit_from_json(d.at("stress_unit"), UnitQuantity::kStress);
      }
    }
  } catch (const json::exception& e) {
    throw DataError(json_path.string() + ": invalid model metadata: " + e.what());
  } catch (const DataError& e) {
    const std::string what = e.what();
    if (what.rfind(json_path.string(), 0) == 0) throw;
    throw DataError(json_path.string() + ": " + what);
  }
  if (!fs::exists(pt)) {  // issue 47: say what is there and what to do
    throw DataError(pt.string() + ": model weights file does not exist, although " + json_path.string() +
                    " does (an unfinished run? finish it with crucible train --resume " + run_dir +
                    ", or give a .pt file of the run)");
  }
  try {
    out.model = model_factory(meta.model_type).from_json(meta.hyperparameters);
  } catch (const std::exception& e) {
    throw DataError(json_path.string() + ": invalid hyperparameters: " + e.what());
  }
  torch::nn::Module& module = out.model->module();
  module.to(dtype_from_name(meta.dtype).value_or(at::kFloat));  // checked above
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : module.named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  for (const auto& b : module.named_buffers()) shapes[b.key()] = b.value().sizes().vec();
  checkpoint::require_data_only_archive_file(pt.string());  // nothing in it runs
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(pt.string());
    module.load(archive);
  } catch (const c10::Error& e) {
    throw DataError(pt.string() + ": cannot be loaded as a " + meta.model_type +
                    " model with the hyperparameters of model.json: " +
                    e.what_without_backtrace());
  }
  auto check_shape = [&](const std::string& name, const at::Tensor& t) {
    auto it = shapes.find(name);
    if (it != shapes.end() && it->second != t.sizes().vec()) {
      std::ostringstream os;
      os << pt.string() << ": tensor '" << name << "' must have shape " << at::IntArrayRef(it->second)
         << " (from model.json hyperparameters), got " << t.sizes();
      throw DataError(os.str());
    }
  };
  for (const auto& p : module.named_parameters()) check_shape(p.key(), p.value());
  for (const auto& b : module.named_buffers()) check_shape(b.key(), b.value());
  module.eval();
  return out;
}

}  // namespace crucible
