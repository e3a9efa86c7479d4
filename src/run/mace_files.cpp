// `crucible import mace` and `crucible export mace` (issue 46): a MACE model
// file → a Crucible run directory (model.pt + model.json with its origin),
// and an imported (fine-tuned) model → MACE's state_dict + hyper-parameters.
// The conversions are the library's (crucible/models/mace/mace_import.h,
// mace_export.h).

#include "crucible/checkpoint/sha256.h"
#include "crucible/run/mace_files.h"
#include "crucible/run/fine_tuning.h"
#include "crucible/run/model_io.h"
#include "crucible/common/error.h"
#include "crucible/models/mace/mace_export.h"
#include "crucible/models/mace/mace_import.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace crucible {

void run_import_mace(const ImportMaceRequest& req, std::ostream& out) {
  namespace fs = std::filesystem;
  if (!fs::exists(req.file)) throw DataError(req.file + ": MACE model file does not exist");
  if (fs::exists(req.out_dir) && !(fs::is_directory(req.out_dir) && fs::is_empty(req.out_dir))) {
    throw ConfigError("--out " + req.out_dir + " exists and is not an empty directory (nothing was written; choose a new one)");
  }
  MaceFile file;
  if (req.hyperparameters.empty()) {
    try {
      file = read_mace_torchscript(req.file);
    } catch (const DataError& e) {
      throw DataError(std::string(e.what()) +
                      ". A .pt state_dict needs --hyperparameters JSON; a pickled .model needs MACE's Python "
                      "package: python3 -m crucible.mace_to_pt MODEL OUT.pt");
    }
  } else {
    file = read_mace_state_dict(req.file, req.hyperparameters);
  }
  ImportedMace imp = import_mace(file);
  // A runnable file: MACE's own module and the import must agree before
  // anything is written (float64 both; rounding differences are ~1e-14).
  std::string probe_line;
  if (file.script) {
    const ProbeResult p = probe_against_torchscript(file, *imp.model);
    if (!(p.energy <= 1e-9) || !(p.forces <= 1e-8)) {
      throw DataError(req.file + fmt::format(": the imported model differs from MACE's own module on the probe structure "
                                             "({} atoms, {} edges): energy {:.2e}, forces {:.2e} relative; nothing was "
                                             "written (please report this file)",
                                             p.atoms, p.edges, p.energy, p.forces));
    }
    probe_line = fmt::format("  probe ({} atoms, {} edges, float64): energy {:.1e}, forces {:.1e} relative to MACE's own module\n",
                             p.atoms, p.edges, p.energy, p.forces);
  }
  ModelMetadata meta = imported_metadata(imp);
  std::ifstream in(req.file, std::ios::binary);
  meta.origin["sha256"] = checkpoint::sha256_hex(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  meta.origin["file"] = fs::absolute(req.file).string();
  if (!req.hyperparameters.empty()) meta.origin["hyperparameters_file"] = fs::absolute(req.hyperparameters).string();
  fs::create_directories(req.out_dir);
  save_model(req.out_dir, *imp.model, meta);
  int64_t params = 0;
  for (const auto& p : imp.model->parameters()) params += p.numel();
  const auto& o = imp.model->options();
  out << fmt::format("imported {} ({}, MACE {}) into {}\n", req.file, file.format,
                     meta.origin.value("mace_version", std::string("version unknown")), req.out_dir);
  out << fmt::format("  {} interactions, hidden {}, max_ell {}, correlation {}, r_max {} Å, {} parameters, {}\n",
                     o.num_interactions, o.hidden_irreps, o.max_ell, o.correlation, o.cutoff, params, meta.dtype);
  out << probe_line;
  out << "  U matrices and Clebsch-Gordan blocks taken from the file; next: crucible evaluate --model " << req.out_dir
      << " --data FILE.xyz\n";
}

void run_export_mace(const ExportMaceRequest& req, std::ostream& out) {
  namespace fs = std::filesystem;
  const fs::path pt(req.out_file);
  if (pt.extension() != ".pt") throw ConfigError("--out must name a .pt file, got '" + req.out_file + "'");
  const fs::path json = fs::path(req.out_file).replace_extension(".json");
  for (const fs::path& p : {pt, json}) {
    if (fs::exists(p)) throw ConfigError(p.string() + " exists (nothing was written; choose another --out)");
  }
  LoadedModel loaded = load_model(req.run_dir);
  const auto* mace = dynamic_cast<const MaceImpl*>(loaded.model.get());
  if (!mace) throw ConfigError(req.run_dir + " holds a " + loaded.meta.model_type + " model; export mace takes a MACE model");
  std::map<std::string, at::Tensor> sd;
  try {
    sd = mace_state_dict(*mace, loaded.meta.e0, loaded.meta.scale, loaded.meta.shift);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(req.run_dir + ": " + e.what());
  }
  write_state_dict_file(pt.string(), sd);
  const std::string text = mace_hyperparameters(*mace, loaded.meta.e0, loaded.meta.scale, loaded.meta.shift).dump(1) + "\n";
  std::ofstream(json.string() + ".tmp") << text;
  fs::rename(json.string() + ".tmp", json);
  out << fmt::format("wrote {} (MACE state_dict, {} tensors) and {} (MACE hyper-parameters)\n", pt.string(), sd.size(),
                     json.string());
  out << "  in MACE: python3 -c \"from crucible.mace_to_pt import load_exported; model = load_exported('" << pt.string()
      << "')\" (needs MACE's Python package)\n";
}

}  // namespace crucible
