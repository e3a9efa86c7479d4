#pragma once
// Saving and loading a trained model: <run_dir>/model.pt + <run_dir>/model.json.

#include "crucible/config/config.h"
#include "crucible/models/energy_model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// What model.json records besides the weights.
struct ModelMetadata {
  std::string model_type = "schnet";  ///< a registered model type (crucible/models/registry.h).
  /// The factory's to_json of the model (cutoff in Å); filled by save_model
  /// when empty.
  nlohmann::json hyperparameters;
  std::string dtype = "float32";      ///< "float32" or "float64": dtype of model.pt.
  std::vector<int64_t> atomic_numbers;  ///< elements seen in training, ascending Z.
  std::map<int64_t, double> e0;       ///< reference energy per element, eV.
  std::string e0_source;              ///< where the E0s came from (data.e0s), "" = not recorded.
  double scale = 1.0;                 ///< energy scale, eV.
  double shift = 0.0;                 ///< energy shift, eV/atom.
  /// The model's minimum interatomic distance, Å: half the closest pair of
  /// its training data (model.json "min_distance_angstrom"). `evaluate`,
  /// the Python calculator and the other inference paths refuse a structure
  /// with two atoms closer than this. Unset (older model.json) = 0.1 Å,
  /// the training-data bound.
  std::optional<double> min_distance;
  /// Data settings of training (keys and file units), reused by `evaluate`.
  DataConfig data;
  /// Where an imported model came from (model.json "origin", issue 46):
  /// {"format": "mace", "reader", "file", "sha256", "mace_version",
  /// "hyperparameters"}; null for a model Crucible trained.
  nlohmann::json origin;
};

/// Writes `<run_dir>/model.pt` (torch::save of the module's parameters and
/// buffers, on CPU, in the model's dtype) and `<run_dir>/model.json`
/// (format "crucible-model" version 1: model_type, hyperparameters (the
/// registered factory's to_json), dtype,
/// cutoff_angstrom, elements, e0_eV, scale_eV, shift_eV_per_atom, units of
/// outputs, data settings). Both via a temporary file + rename.
/// The model is moved to CPU. @throws DataError if a file cannot be written.
void save_model(const std::string& run_dir, EnergyModel& model, const ModelMetadata& meta);

/// A model loaded from a run directory.
struct LoadedModel {
  std::shared_ptr<EnergyModel> model;  ///< on CPU, in `meta.dtype`, eval mode.
  ModelMetadata meta;
};

/// Writes only the weights of `model` to `file` (torch::save archive, via a
/// temporary file + rename), e.g. model_last.pt beside model.pt; moves the
/// model to CPU. @throws DataError if the file cannot be written.
void save_model_weights(const std::string& file, EnergyModel& model);

/// Loads `<run_dir>/model.json` and `<run_dir>/model.pt`; `run_dir` may
/// also be a weights file such as `<run>/model_last.pt`, read with the
/// model.json beside it.
/// @throws DataError naming the file if either is missing, unreadable or
///         inconsistent (unknown format/model type, wrong parameter shapes).
LoadedModel load_model(const std::string& run_dir);

}  // namespace crucible
