// `crucible evaluate`: error metrics of a trained model on an extxyz file.

#include "crucible/common/dtype_names.h"
#include "crucible/cli/commands.h"
#include "crucible/run/data_paths.h"
#include "crucible/run/training_setup.h"
#include "crucible/run/model_io.h"
#include "crucible/run/e0s.h"
#include "crucible/report/error_report.h"
#include "crucible/run/label_keys.h"
#include "crucible/data/label_audit.h"
#include "crucible/data/formats.h"
#include "crucible/report/parity_plot.h"
#include "crucible/common/error.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/data/structure_checks.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

namespace crucible {

namespace {


/// Every structure of `dataset` with the model's predictions, written to
/// `write_path` (through a temporary file and a rename), and their parity
/// plot to `parity_path`, where set.
void write_predictions(EnergyModel& model, const AtomicDataset& dataset, at::Device device, const EvaluateOptions& eo,
                       const std::optional<std::string>& write_path, const std::optional<std::string>& parity_path,
                       const std::string& title) {
  ParityData parity;
  parity.title = title;
  std::vector<Structure> frames;
  frames.reserve(static_cast<size_t>(dataset.size()));
  for (int64_t start = 0; start < dataset.size(); start += eo.batch_size) {
    std::vector<int64_t> idx;
    for (int64_t k = start; k < std::min(dataset.size(), start + eo.batch_size); ++k) idx.push_back(k);
    const Batch batch = dataset.collate(idx).to(device, eo.dtype);
    ComputeOptions co;
    co.forces = true;
    co.stress = true;
    co.energies = true;  // per-atom energies from the same evaluation
    const ModelOutputs out = compute_outputs(model, batch, co);
    const at::Tensor node = out.energies.to(at::kCPU, at::kDouble);
    const at::Tensor forces = out.forces.to(at::kCPU, at::kDouble);
    const at::Tensor ptr = batch.ptr.to(at::kCPU);
    for (size_t b = 0; b < idx.size(); ++b) {
      Structure s = dataset.structure(idx[b]);
      const int64_t lo = ptr[static_cast<int64_t>(b)].item<int64_t>(), hi = ptr[static_cast<int64_t>(b) + 1].item<int64_t>();
      s.info["crucible_energy"] = fmt::format("{:.17g}", out.energy[static_cast<int64_t>(b)].item<double>());
      const int group = parity.group_of(s.config_type);
      if (s.has_volume()) {  // issue 47: no stress without a volume (a slab with c = 0)
        const at::Tensor st = out.stress[static_cast<int64_t>(b)].to(at::kCPU, at::kDouble).contiguous();
        std::string text;
        for (int64_t k = 0; k < 9; ++k) text += fmt::format("{}{:.17g}", k ? " " : "", st.data_ptr<double>()[k]);
        s.info["crucible_stress"] = text;
        if (s.stress) {
          const at::Tensor sr = s.stress->to(at::kDouble).contiguous().view({-1});
          for (int64_t k = 0; k < 9; ++k) {
            parity.stress_ref.push_back(sr.data_ptr<double>()[k]);
            parity.stress_pred.push_back(st.data_ptr<double>()[k]);
            parity.stress_group.push_back(group);
          }
        }
      }
      s.arrays = {{"crucible_forces", forces.narrow(0, lo, hi - lo)}, {"crucible_energies", node.narrow(0, lo, hi - lo)}};
      const double n = static_cast<double>(hi - lo);
      if (s.energy) {
        parity.energy_ref.push_back(*s.energy / n);
        parity.energy_pred.push_back(out.energy[static_cast<int64_t>(b)].item<double>() / n);
        parity.energy_group.push_back(group);
      }
      if (s.forces) {
        const at::Tensor fr = s.forces->to(at::kDouble).contiguous().view({-1});
        const at::Tensor fp = forces.narrow(0, lo, hi - lo).contiguous().view({-1});
        parity.forces_ref.insert(parity.forces_ref.end(), fr.data_ptr<double>(), fr.data_ptr<double>() + fr.numel());
        parity.forces_pred.insert(parity.forces_pred.end(), fp.data_ptr<double>(), fp.data_ptr<double>() + fp.numel());
        parity.forces_group.insert(parity.forces_group.end(), static_cast<size_t>(fr.numel()), group);
      }
      if (write_path) frames.push_back(std::move(s));
    }
  }
  if (parity_path) write_parity_svg(*parity_path, parity);
  if (!write_path) return;
  const std::string tmp = *write_path + ".tmp";
  write_extxyz(tmp, frames);
  std::error_code ec;
  std::filesystem::rename(tmp, *write_path, ec);
  if (ec) throw DataError(*write_path + ": --write file cannot be written (" + ec.message() + ")");
}

/// One line per spline table (grid, size, measured errors) under `title`,
/// then how to run `exact` instead.
void print_splines(std::ostream& out, const std::string& title, const std::string& unit,
                   const std::vector<std::shared_ptr<const mace::RadialSpline>>& splines, const std::string& exact) {
  for (size_t t = 0; t < splines.size(); ++t) {
    const auto& s = splines[t];
    out << fmt::format("{}{} {}: {} intervals of {:.4g} Å on [0, {:.4g}] Å, {} outputs, {:.1f} MB {}; "
                       "error {:.1e} (values), {:.1e} (derivatives), relative, measured at 3 points per interval\n",
                       t == 0 ? title : std::string(title.size(), ' '), unit, t, s->num_intervals(), s->spacing(),
                       s->r_max(), s->num_outputs(), static_cast<double>(s->bytes()) / 1e6,
                       s->dtype() == at::kFloat ? "float32" : "float64", s->value_error(), s->derivative_error());
  }
  out << std::string(title.size(), ' ') << "(the inference path; CRUCIBLE_RADIAL_SPLINE=0 or evaluate --exact "
      << "evaluates " << exact << " exactly)\n";
}

}  // namespace

std::string model_directory(const std::string& path) {
  const std::filesystem::path p(path);
  if (std::filesystem::is_regular_file(p) && p.extension() == ".pt") return p.parent_path().string();
  return path;
}

void run_info(const std::string& path, std::ostream& out) {
  const std::string dir = model_directory(path);
  LoadedModel loaded = load_model(path);  // a .pt file itself (model_last.pt) or a run
  const auto& m = loaded.meta;
  int64_t params = 0;
  for (const auto& p : loaded.model->module().parameters()) params += p.numel();
  std::string elements, e0;
  for (int64_t z : m.atomic_numbers) {
    elements += (elements.empty() ? "" : " ") + chemical_symbol(z);
    auto it = m.e0.find(z);
    e0 += fmt::format("{}{} {:.6f}", e0.empty() ? "" : ", ", chemical_symbol(z), it == m.e0.end() ? 0.0 : it->second);
  }
  out << fmt::format("model           {}\n", dir);
  out << fmt::format("type            {}\n", m.model_type);
  if (m.origin.is_object()) {
    const auto& o = m.origin;
    out << fmt::format("origin          imported from {} {} ({}), sha256 {}\n",
                       o.value("format", std::string("?")) == "mace" ? "MACE" : o.value("format", std::string("?")),
                       o.contains("mace_version") ? o.at("mace_version").get<std::string>() : std::string("(version unknown)"),
                       o.value("file", std::string("?")), o.value("sha256", std::string("?")));
  }
  out << fmt::format("hyperparameters {}\n", m.hyperparameters.dump());
  out << fmt::format("parameters      {}\n", params);
  out << fmt::format("elements        {}\n", elements);
  out << fmt::format("E0 (eV)         {}{}\n", e0, m.e0_source.empty() ? "" : " (" + m.e0_source + ")");
  out << fmt::format("scale, shift    {:.6g} eV, {:.6g} eV/atom\n", m.scale, m.shift);
  out << fmt::format("cutoff          {} Å\n", loaded.model->cutoff());
  out << fmt::format("dtype           {}\n", m.dtype);
  out << "units           energy eV, forces eV/Å, stress eV/Å^3\n";
  // Issue 47: what stops an MD run and what sets its ghost cost.
  if (m.min_distance) {
    out << fmt::format("min distance    {:.4g} Å (the closest pair of the training data; evaluate, the calculator and "
                       "the KIM model refuse atoms closer than this)\n",
                       *m.min_distance);
  }
  out << fmt::format("interaction range {:.4g} Å (message-passing layers x cutoff: an atom's energy depends on "
                     "atoms this far away; the KIM model's influence distance, the reach of LAMMPS's ghost atoms)\n",
                     loaded.model->interaction_range());
  // Issue 48: the inference path's radial functions are splines of r.
  if (auto* mace = dynamic_cast<MaceImpl*>(loaded.model.get()); mace && mace->radial_spline_enabled()) {
    std::vector<std::shared_ptr<const mace::RadialSpline>> splines;
    for (int64_t t = 0; t < mace->options().num_interactions; ++t) splines.push_back(mace->radial_spline(t));
    print_splines(out, "radial splines  ", "layer", splines, "the radial MLP");
  }
  if (auto* schnet = dynamic_cast<SchNetImpl*>(loaded.model.get()); schnet && schnet->filter_spline_enabled()) {
    std::vector<std::shared_ptr<const mace::RadialSpline>> splines;
    for (int64_t t = 0; t < schnet->options().num_interactions; ++t) splines.push_back(schnet->filter_spline(t));
    print_splines(out, "filter splines  ", "interaction", splines, "the filter network");
  }
  const std::filesystem::path summary_path = std::filesystem::path(dir) / "summary.json";
  if (std::filesystem::exists(summary_path)) {  // issue 47: how good the model is
    try {
      std::ifstream in(summary_path);
      const nlohmann::json s = nlohmann::json::parse(in);
      if (s.contains("validation")) {
        const ValidationSummary v = validation_from_json(s.at("validation"));
        out << fmt::format("validation      of model.pt on the run's {} validation structures (summary.json):\n",
                           v.num_structures);
        write_error_report(out, v, "  ");
      }
    } catch (const nlohmann::json::exception& e) {
      out << "validation      " << summary_path.string() << " cannot be read (" << e.what() << ")\n";
    }
  } else {
    out << "validation      none recorded (no summary.json beside the model: an imported or unfinished model)\n";
  }
  const std::filesystem::path recipe = std::filesystem::path(dir) / "config.yaml";
  if (std::filesystem::exists(recipe)) {
    const Config c = load_config_file(recipe.string());
    out << fmt::format("precision       {}\n", c.training.precision ? *c.training.precision : c.training.dtype);
    out << "recipe (" << recipe.string() << "):\n" << dump_config(c, false);
  } else {
    out << "recipe          none (no config.yaml beside the model)\n";
  }
}

ValidationSummary run_evaluation(const EvaluateRequest& req, std::ostream& out, std::ostream& err) {
  (void)err;  // warnings: none at present (unseen elements are errors, issue 17)
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

  LoadedModel loaded = load_model(req.model_dir);  // a run or a .pt file (model_last.pt)
  Config config = default_config();
  config.data = loaded.meta.data;  // keys and units the model was trained with
  apply_overrides(config, req.overrides);
  const DataConfig& d = config.data;

  const std::string path = resolve_data_path(req.data_file, "--data");
  std::vector<Structure> structures = read_structures(path, d.format, extxyz_options(d));
  {
    LabelAudit audit;  // issue 47: a label under a key not named is an error, not "n/a"
    audit.add(path, structures, extxyz_options(d));
    audit.throw_if_any();
  }
  StructureLimits limits;
  if (loaded.meta.min_distance) limits.min_distance = *loaded.meta.min_distance;  // the model's minimum
  check_structures(structures, "--data", limits);
  if (structures.empty()) {
    throw DataError(path + ": --data must contain at least one structure, got none");
  }
  // Issue 18: keys that match nothing are an error (unless only predictions
  // are asked for), listing the file's keys.
  {
    bool energy = false, forces = false;
    for (const auto& s : structures) {
      energy = energy || s.energy.has_value();
      forces = forces || s.forces.has_value();
    }
    if (!energy && !forces && !req.write_path) {
      throw DataError(missing_label_message(structures, path, LabelKind::kEnergy, d) + "; and " +
                      missing_label_message(structures, path, LabelKind::kForces, d).substr(path.size() + 2) +
                      " (or give --write to only write predictions)");
    }
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
    throw DataError(path + ": --data must contain only elements the model was trained on (" + elements.substr(1) +
                    "), got" + unseen);
  }

  const double cutoff = loaded.model->cutoff();
  // Issue 47: isolated atoms are treated as training's validation treats
  // them. A model whose E0s are the isolated-atom energies (data.e0s
  // isolated) left them out of training and validation, so they are left out
  // of the errors here too, and reported on their own line.
  const bool isolated_e0s = loaded.meta.e0_source.rfind("isolated atoms", 0) == 0;
  const auto n_isolated = std::count_if(structures.begin(), structures.end(), is_isolated_atom);
  const size_t num_frames = structures.size();
  std::vector<Structure> isolated;
  std::optional<AtomicDataset> all_frames;  // --write and --parity show every frame
  if (isolated_e0s && n_isolated > 0 && n_isolated < static_cast<int64_t>(num_frames)) {
    if (req.write_path || req.parity_path) all_frames.emplace(structures, cutoff);
    isolated = take_isolated_atoms(structures);
  }
  AtomicDataset dataset(std::move(structures), cutoff);  // the frames the errors are over
  EvaluateOptions eo;
  eo.batch_size = req.batch_size;
  eo.stress = true;
  eo.dtype = dtype_from_name(loaded.meta.dtype).value_or(at::kFloat);  // load_model checked it
  loaded.model->module().to(device);
  if (req.exact) {  // the reference path: no splines (issue 48)
    if (auto* mace = dynamic_cast<MaceImpl*>(loaded.model.get())) mace->set_radial_spline(false);
    if (auto* schnet = dynamic_cast<SchNetImpl*>(loaded.model.get())) schnet->set_filter_spline(false);
  }
  const ValidationSummary v = evaluate_model(*loaded.model, dataset, device, eo);

  out << fmt::format("model      {} ({}, {}, cutoff {} Å, elements{})\n", req.model_dir,
                     loaded.meta.model_type, loaded.meta.dtype, cutoff, elements);
  out << fmt::format("data       {}: {} structures, {} atoms\n", path, num_frames, atoms);
  out << fmt::format("units      energy {}, forces {}, stress {}\n", d.energy_unit.to_string(),
                     d.forces_unit.to_string(), d.stress_unit.to_string());
  out << fmt::format("structures {}\n", v.num_structures);
  write_error_report(out, v, "");  // issue 47: MAE and RMSE, baselines, config_type table
  if (!isolated.empty()) {
    AtomicDataset alone(isolated, cutoff);
    const ValidationSummary vi = evaluate_model(*loaded.model, alone, device, eo);
    out << fmt::format("isolated atoms: {} frame{} left out of the errors above, as training's validation left them "
                       "out (their energies are the model's E0s, data.e0s isolated); energy MAE on them {}\n",
                       isolated.size(), isolated.size() > 1 ? "s" : "", format_metric(vi.energy_mae, vi.num_energies, "meV/atom"));
  } else if (n_isolated > 0) {
    out << fmt::format("isolated atoms: {} frame{} counted in the errors above, as training's validation counts them "
                       "(the model's E0s: {})\n",
                       n_isolated, n_isolated > 1 ? "s" : "",
                       loaded.meta.e0_source.empty() ? std::string("not recorded") : loaded.meta.e0_source);
  }
  out.flush();
  if (req.write_path || req.parity_path) {
    write_predictions(*loaded.model, all_frames ? *all_frames : dataset, device, eo, req.write_path, req.parity_path,
                      fmt::format("{} model {} on {} ({} structures)", loaded.meta.model_type, req.model_dir, req.data_file,
                                  num_frames));
  }

  if (req.json_path) {
    nlohmann::json j;
    for (const auto& [k, val] : v.as_map()) {
      j[k] = std::isfinite(val) ? nlohmann::json(val) : nlohmann::json();
    }
    j["mean_energy_rmse"] = v.num_energies > 1 ? nlohmann::json(v.mean_energy_rmse) : nlohmann::json();
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
