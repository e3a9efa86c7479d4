#pragma once
// MACE files in and out of run directories (issue 46): `crucible import
// mace` and `crucible export mace` as library functions (the CLI and the
// Python module call them).

#include <ostream>
#include <string>

namespace crucible {

/// Options of `crucible import mace` (issue 46).
struct ImportMaceRequest {
  std::string file;             ///< a MACE `_compiled.model` (TorchScript) or a `.pt` state_dict.
  std::string hyperparameters;  ///< JSON of MACE's hyper-parameters; required for a `.pt`, empty for TorchScript.
  std::string out_dir;          ///< new or empty run directory to write.
};
/// `crucible import mace`: reads the file (crucible/models/mace/mace_import.h),
/// builds the Crucible model with the file's weights, U matrices and
/// Clebsch-Gordan blocks, and writes `out_dir/model.pt` + `model.json`
/// (its "origin": format, reader, file, sha256, MACE version), which every
/// path that takes a run directory uses.
/// @throws ConfigError if out_dir exists and is not empty (nothing written);
///         DataError naming the file for unreadable input or a model Crucible
///         cannot represent (what is missing is named).
void run_import_mace(const ImportMaceRequest& request, std::ostream& out);

/// Options of `crucible export mace` (issue 46).
struct ExportMaceRequest {
  std::string run_dir;   ///< run directory, or model.pt with model.json beside it.
  std::string out_file;  ///< FILE.pt to write; FILE.json is written beside it.
};
/// `crucible export mace`: MACE's state_dict (every name and shape of
/// ScaleShiftMACE: load_state_dict(strict=True) takes it) and its
/// hyper-parameters as JSON (crucible/models/mace/mace_export.h) of a model
/// imported from MACE, fine-tuned or not.
/// @throws ConfigError if an output file exists (nothing written), the model
///         is not MACE or was trained by Crucible (its own product basis);
///         DataError for an unreadable model or an unwritable file.
void run_export_mace(const ExportMaceRequest& request, std::ostream& out);

}  // namespace crucible
