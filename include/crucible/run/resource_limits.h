#pragma once
// Limits instead of trust (issue 15): what a config or a data set would make
// the machine allocate is estimated and checked before it is allocated.

#include "crucible/config/config.h"
#include "crucible/data/structure.h"

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/training/allocator.h"  // available_memory_bytes

namespace crucible {

/// `training.num_threads` may be at most 4 × the cores of this machine
/// (std::thread::hardware_concurrency).
/// @throws ConfigError "training.num_threads must be <= 8 (4 × the 2 cores
///   of this machine), got 100000".
void check_thread_count(int64_t num_threads);

/// Parameter count of the model.type model from its keys alone (the
/// registered factory's parameter_estimate; SchNet exact to the leading
/// terms, MACE an upper estimate); in training each parameter costs 16
/// bytes in float32 (weight, gradient, two Adam moments).
/// @throws ConfigError for keys the estimate cannot read.
double model_parameter_estimate(const ModelConfig& model);

/// @throws ConfigError naming the model.<type>.* keys when the estimated
///   training state (model_parameter_estimate × 16 bytes) exceeds
///   `available_bytes`, before anything is allocated.
void check_model_size(const ModelConfig& model, int64_t available_bytes);

/// Estimated neighbor pairs within `cutoff` (Å) of `structures`: per
/// structure N · min(N - 1 + images, ρ · 4/3 π rc³) with ρ = N / V (the
/// cell's volume when periodic, else the bounding box grown by rc).
double estimate_neighbor_pairs(const std::vector<Structure>& structures, double cutoff);

/// @throws DataError naming `file`, model.cutoff and the bound when the
///   neighbor lists (40 bytes a pair: two int64 indices, three float64
///   shifts) would need more than half of `available_bytes`.
void check_neighbor_memory(const std::vector<Structure>& structures, double cutoff,
                           const std::string& file, int64_t available_bytes);

}  // namespace crucible
