#pragma once
// Importing a model trained by the reference MACE (ACEsuit/mace v0.3,
// ScaleShiftMACE with e3nn 0.4.4 / 0.5.x), issue 46. The design, the weight
// layouts and what is refused: docs/mace_import.md.

#include "crucible/models/mace/mace.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace crucible {

/// What a MACE model file holds, in MACE's names.
struct MaceFile {
  std::string path;    ///< the file read.
  std::string format;  ///< "torchscript" (a `_compiled.model`) or "state_dict" (a `.pt`).
  /// MACE's hyper-parameters (`extract_config_mace_model`) with typed values:
  /// numbers, bools, lists, null, class and function names without their
  /// module ("RealAgnosticResidualInteractionBlock", "silu").
  nlohmann::json hyperparameters;
  /// Every state_dict entry (parameters and buffers), CPU, the file's dtype.
  std::map<std::string, at::Tensor> tensors;
  /// Per interaction block its avg_num_neighbors (TorchScript attributes);
  /// empty for a state_dict (the hyper-parameters hold it).
  std::vector<double> avg_num_neighbors;
  /// TorchScript: MACE's own runnable module (probe_against_torchscript);
  /// null for a state_dict.
  std::shared_ptr<torch::jit::Module> script;
};

/// Reads MACE's TorchScript export (`NAME_compiled.model`) with LibTorch
/// alone: parameters and buffers, the `extra/config.yaml` extra file (JSON
/// whose values are Python strs) and each interaction's avg_num_neighbors.
/// @throws DataError naming the file: unreadable, not TorchScript, written by
///         a PyTorch newer than this LibTorch (naming the `.pt` route), or no
///         config.yaml.
MaceFile read_mace_torchscript(const std::string& path);

/// Reads a `.pt` written by torch.save: a state_dict, {"model": state_dict}
/// (MACE's checkpoints) or a dict with a "model" entry; the hyper-parameters
/// from a JSON file (`extract_config_mace_model(model)` as JSON, e.g.
/// `python3 -m crucible.mace_to_pt`, or the config.yaml of a
/// `_compiled.model`).
/// @throws DataError naming the file for unreadable or malformed input.
MaceFile read_mace_state_dict(const std::string& pt_path, const std::string& hyperparameters_json);

/// A MACE model as a Crucible model.
struct ImportedMace {
  std::shared_ptr<MaceImpl> model;   ///< CPU, the file's dtype, eval mode, MaceOptions::basis "mace".
  at::ScalarType dtype = at::kDouble;
  std::map<int64_t, double> e0;      ///< E0 per element, eV (MACE's atomic_energies).
  double scale = 1.0;                ///< eV (MACE's scale_shift.scale).
  double shift = 0.0;                ///< eV/atom (scale_shift.shift).
  /// Where it came from, for model.json: format, file, MACE's version when
  /// known, and MACE's hyper-parameters.
  nlohmann::json origin;
};

/// Builds the Crucible model from a MACE file: every tensor of the file is
/// used (U matrices and Clebsch-Gordan blocks included, docs/mace_import.md)
/// or is one of MACE's bookkeeping buffers (empty biases, output masks,
/// atomic_numbers, r_max, num_interactions, Bessel constants checked against
/// the hyper-parameters).
/// @throws DataError naming the file and what Crucible lacks for a model it
///         cannot represent (heads, interaction or readout classes, a gate
///         other than silu, per-layer avg_num_neighbors or correlation that
///         differ, ...) or a tensor of an unexpected name or shape. MACE's
///         ZBL pair_repulsion is imported (MaceOptions::pair_repulsion).
ImportedMace import_mace(const MaceFile& file);

/// How the imported model and MACE's own module agree on the probe.
struct ProbeResult {
  int64_t atoms = 0, edges = 0;  ///< size of the probe structure
  double energy = 0;             ///< |ΔE| / |E_mace|
  double forces = 0;             ///< max |ΔF| / max |F_mace|
};

/// Runs MACE's TorchScript module (`file.script`) and a float64 copy of
/// `model` on one probe structure: 8 atoms of the model's elements (cycled)
/// in a sheared periodic cell of ~4.9 Å, displaced off the lattice
/// deterministically, with Crucible's neighbour list handed to both (MACE's
/// sender/receiver order, its shift sign). Both in float64.
/// @throws DataError naming the file if it has no runnable module or MACE's
///         module fails on the probe.
ProbeResult probe_against_torchscript(const MaceFile& file, const MaceImpl& model);

/// e3nn's normalisation of SiLU (e3nn math/_normalize_activation.py,
/// normalize2mom): 1/√mean(silu(z)²) over 10^6 float64 normal draws of a CPU
/// generator seeded 0, as e3nn computes it when MACE builds the model.
double e3nn_silu_normalization();

}  // namespace crucible
