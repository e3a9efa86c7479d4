#pragma once
// Exporting an imported (and possibly fine-tuned) MACE model back to MACE
// (issue 46): MACE's state_dict, every name and shape of ScaleShiftMACE so
// that `load_state_dict(strict=True)` accepts it, and MACE's
// hyper-parameters as JSON. docs/mace_import.md has the layouts.

#include "crucible/models/mace/mace.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

namespace crucible {

/// MACE's state_dict of a `basis: mace` model (MaceOptions::basis): weights
/// (mace_layout), the U matrices and Clebsch-Gordan blocks it holds, the
/// radial constants, E0s [1, n_elements], scale / shift [1], and MACE's
/// bookkeeping buffers (empty biases, output masks of ones, the "zeroed"
/// flags false, atomic_numbers, r_max, num_interactions). Tensors on CPU in
/// the model's dtype (int64 / int32 / bool where MACE has them).
/// @throws std::invalid_argument if the model is not `basis: mace` (a MACE
///         trained by Crucible uses Crucible's product basis and frame).
std::map<std::string, at::Tensor> mace_state_dict(const MaceImpl& model, const std::map<int64_t, double>& e0,
                                                  double scale, double shift);

/// MACE's hyper-parameters of the model (the keys of MACE's
/// extract_config_mace_model with JSON types, as `crucible import mace
/// --hyperparameters` reads them): ScaleShiftMACE with
/// RealAgnosticInteractionBlock, then RealAgnosticResidualInteractionBlock,
/// NonLinearReadoutBlock, gate silu, Bessel radial basis. Never throws.
nlohmann::json mace_hyperparameters(const MaceImpl& model, const std::map<int64_t, double>& e0, double scale,
                                    double shift);

/// Writes `tensors` as a state_dict file that Python's torch.load reads
/// (torch::pickle_save; a plain dict of name → tensor). @throws DataError
/// naming the file if it cannot be written (written to a temporary name and
/// renamed, so an existing file is never half-written).
void write_state_dict_file(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

}  // namespace crucible
