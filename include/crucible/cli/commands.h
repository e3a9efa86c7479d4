#pragma once
// The commands whose work is their own output: `crucible evaluate`, `info`,
// `convert` and `export kim` (cli.cpp parses arguments and calls these).
// A training run and the MACE import/export are library functions in
// crucible/run/ (docs/architecture/layers.md).

#include "crucible/config/config.h"
#include "crucible/training/metrics.h"

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace crucible {

/// Options of `crucible evaluate`.
struct EvaluateRequest {
  std::string model_dir;                 ///< run directory with model.json / model.pt.
  std::string data_file;                 ///< extxyz file to evaluate on.
  std::vector<std::string> overrides;    ///< "data.key=value" (keys and units).
  int64_t batch_size = 32;               ///< structures per batch, >= 1.
  std::string device = "cpu";            ///< cpu, cuda, cuda:N.
  std::optional<std::string> json_path;  ///< also write the metrics here as JSON.
  /// Also write every structure with the predictions (issue 17) to this
  /// extxyz file: crucible_energy (eV), crucible_stress (9 values, eV/Å³,
  /// periodic frames), columns crucible_forces (eV/Å) and crucible_energies
  /// (eV per atom), next to the reference labels (in eV units).
  std::optional<std::string> write_path;
  /// Also draw energy and force parity plots (SVG) to this file.
  std::optional<std::string> parity_path;
  /// MACE: evaluate the radial MLP per pair (the reference path) instead of
  /// its splines (issue 48; `--exact`).
  bool exact = false;
};

/// `crucible info PATH`: a model's type, hyperparameters, parameter count,
/// elements, E0s, scale / shift, cutoff, dtype and, for a run directory, the
/// recipe it was trained with (config.yaml). PATH is a run directory or a
/// model.pt with model.json beside it.
/// @throws DataError naming the file for a missing or bad model.
void run_info(const std::string& path, std::ostream& out);

/// Options of `crucible convert` (issue 18).
struct ConvertRequest {
  std::string input;                   ///< extxyz file, DeePMD system directory or ASE .db.
  std::string output;                  ///< .xyz / .extxyz file, or a new directory (DeePMD).
  std::string from = "auto";           ///< auto, extxyz, deepmd, ase_db.
  std::string to = "auto";             ///< auto (by OUT's extension), extxyz, deepmd.
  std::vector<std::string> overrides;  ///< data.* keys and units of the input.
  bool overwrite = false;              ///< replace an existing OUT (never IN itself).
};
/// `crucible convert IN OUT`: reads IN (read_structures, the data.* keys and
/// units of `overrides`; labels in eV, eV/Å, eV/Å³) and writes OUT
/// (write_structures). extxyz → DeePMD → extxyz keeps every value bit for
/// bit for frames of one composition (DeePMD groups frames by atoms).
/// OUT is never IN (refused even with `overwrite`), an existing OUT is
/// refused unless `overwrite`, and a failed write leaves no file behind.
/// @throws ConfigError for a non-data override, DataError for unreadable
///         input, an output that exists or is the input, a write failure.
void run_convert(const ConvertRequest& request, std::ostream& out);

/// Options of `crucible export kim` (issue 17).
struct ExportKimRequest {
  std::string run_dir;  ///< run directory, or a model.pt with model.json beside it.
  std::string name;     ///< KIM portable model name (a C identifier); the driver is NAME_driver.
  std::string out_dir;  ///< new or empty directory to write.
  /// "float64" (default) or "float32": the dtype the KIM model evaluates in
  /// (as MACE's LAMMPS export, `--default_dtype`). float32 takes about half
  /// the time per step; energies and forces then carry float32 rounding
  /// (~1e-7 relative), which shows as drift in long NVE runs.
  std::string dtype = "float64";
};
/// `crucible export kim`: writes `out_dir`, a KIM item directory that
/// `kim-api-collections-management install user OUT_DIR` builds and
/// installs: the model driver NAME_driver (libcrucible_kim.so, Crucible's
/// KIM driver, copied in) and the parameterized portable model NAME (in
/// model/, with model.json, model.pt and settings.json — the dtype — as its
/// parameter files). Written
/// to a temporary sibling and renamed, so a failure leaves nothing.
/// Layout and physics: docs/deployment_kim.md.
/// @throws ConfigError for a bad name or dtype or a build without the KIM driver,
///         DataError for a bad model or an `out_dir` that exists and is not
///         empty.
void run_export_kim(const ExportKimRequest& request, std::ostream& out);
/// Path of libcrucible_kim.so in the build tree; "" when built without
/// libkim-api-dev. Never throws.
std::string kim_engine_path();
/// The run directory of PATH: PATH itself, or the folder of a model.pt.
/// Never throws.
std::string model_directory(const std::string& path);

/// `crucible evaluate`: loads the model, reads `data_file` with the data
/// settings of training (keys, units) updated by `overrides`, prints the
/// number of structures and energy (meV/atom), force (meV/Å) and stress
/// (meV/Å³, when present) MAE/RMSE plus the zero-forces baseline, then a
/// row per config_type when there are several; with `write_path` also the
/// predictions file.
/// @throws ConfigError for a bad override (only data.* keys are allowed),
///         DataError for a bad model directory or data file.
ValidationSummary run_evaluation(const EvaluateRequest& request, std::ostream& out,
                                 std::ostream& err);

}  // namespace crucible
