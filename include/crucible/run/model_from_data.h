#pragma once
// A model built from its recipe and its training data, as build_training
// builds one without a fine-tuning source: the parts a user assembles a
// strategy from (crucible.build_model in Python; seed 002's "models").

#include "crucible/config/config.h"
#include "crucible/data/dataset.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/registry.h"
#include "crucible/run/model_io.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace crucible {

/// What the training neighbor lists say about the data.
struct NeighborStats {
  int64_t edges = 0;  ///< directed pairs within the cutoff, all structures.
  int64_t atoms = 0;  ///< atoms, all structures.
  /// Mean neighbors per atom (MACE's avg_num_neighbors); 1 without atoms.
  double avg_num_neighbors = 1.0;
  /// Closest pair within the cutoff, Å; infinity without pairs.
  double min_pair_distance = std::numeric_limits<double>::infinity();
};

/// Edges, atoms, mean neighbor count and closest pair of the first
/// `count` structures of `dataset` (all when negative), from its neighbor
/// lists (r_ij = r_j - r_i + shift, ASE's convention). Never throws.
NeighborStats neighbor_stats(const AtomicDataset& dataset, int64_t count = -1);

/// The atomic numbers of `parts`' structures, ascending. Never throws.
std::set<int64_t> elements_of(std::initializer_list<const std::vector<Structure>*> parts);

/// A run's parameter dtype: training.precision's when set (float64 for
/// 64-true, float32 for the others, issue 3), else training.dtype
/// (float32 when the name is not one validate_config accepts). Never throws.
at::ScalarType run_dtype(const TrainingConfig& training);

/// `make()` (a model of model.type `type`) with its parameters created
/// under training.precision's module_init_context (seed 004; float32 for
/// the mixed modes) when a precision is set.
/// @throws ConfigError "model.<type>: ..." for the std::invalid_argument
///   a factory throws for a bad key value (kept as is when it already
///   names a model.* key).
std::shared_ptr<EnergyModel> create_model(const std::string& type, const TrainingConfig& training,
                                          const std::function<std::shared_ptr<EnergyModel>()>& make);

/// The model.json metadata of `model` (config.model.type, its factory's
/// hyperparameters, `dtype`, elements, E0s in eV from `e0` [119] indexed
/// by Z, scale in eV, shift in eV/atom, half the closest training pair in Å
/// as the minimum distance (none when not finite), config.data); origin
/// null. @throws what the factory's to_json throws for another model type.
ModelMetadata model_metadata(const Config& config, const EnergyModel& model, at::ScalarType dtype,
                             const std::set<int64_t>& elements, const at::Tensor& e0,
                             const std::string& e0_source, double scale, double shift,
                             double min_pair_distance);

/// A model and the metadata save_model writes for it.
struct BuiltModel {
  std::shared_ptr<EnergyModel> model;  ///< on `dtype`, normalization set.
  ModelMetadata meta;                  ///< type, hyperparameters, dtype, elements, E0s, scale/shift, min distance.
  std::vector<std::string> warnings;   ///< e.g. an E0 fit that cannot separate elements.
};

/// The model.type model of `config` (its keys, model.cutoff) for the
/// structures of `train`: elements and avg_num_neighbors from them; E0s by
/// data.e0s (least_squares, zero, a map or a file; `isolated` and the
/// fine-tuning modes need build_training), scale and shift by
/// model.scaling / model.shift; parameters initialised from training.seed
/// and cast to training.dtype (training.precision's parameter dtype when
/// set). `train` must have been built with model.cutoff.
/// @throws ConfigError naming the key for a bad recipe, a dataset of
///   another cutoff, an E0 mode that needs build_training, or a cutoff that
///   leaves every atom without a neighbor.
BuiltModel build_model_from_data(const Config& config, const AtomicDataset& train);

}  // namespace crucible
