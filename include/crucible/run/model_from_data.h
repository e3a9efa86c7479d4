#pragma once
// A model built from its recipe and its training data, as build_training
// builds one without a fine-tuning source: the parts a user assembles a
// strategy from (crucible.build_model in Python; seed 002's "models").

#include "crucible/config/config.h"
#include "crucible/data/dataset.h"
#include "crucible/models/energy_model.h"
#include "crucible/run/model_io.h"

#include <cstdint>
#include <limits>
#include <memory>
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
