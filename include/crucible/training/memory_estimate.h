#pragma once
// What a training run will hold in memory at its peak, estimated before the
// large allocations (issue 47): the process, the structures, their neighbor
// lists, the training state and the activations of the largest batch.
// Design and calibration: docs/training_memory.md.

#include "crucible/data/extxyz.h"  // structures_bytes

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

/// Bytes a neighbor list holds per directed pair: edge_index (2 × int64),
/// shift vectors (3 × float64) and integer cell shifts (3 × int64). Measured
/// 61-67 B a pair on Cu cells with 3.0, 5.0 and 6.0 Å cutoffs.
inline constexpr double kNeighborPairBytes = 64.0;

/// How many parameter-sized tensors training holds at its peak for an
/// optimizer: the weights, their gradients, the optimizer's moments
/// (adam/adamw 2, amsgrad 3; sgd 1 with momentum; rmsprop 1, +1 centered,
/// +1 momentum; adagrad 1), the EMA copy when `ema`, the best validation's
/// copy, and the checkpoint, which serializes weights, gradients and
/// moments in memory (plus one transient copy of its largest archive and
/// the optimizer's temporaries: 3.5 copies). Adam without EMA: 12.5,
/// matching the measured peak of an 18.3M-parameter SchNet (100 B a
/// float64 parameter). @throws std::invalid_argument for an unknown name.
double training_state_copies(const std::string& optimizer, bool amsgrad, double momentum, bool centered, bool ema);

/// Activation size of a model per batch: numbers live at the peak of a
/// training step (forward, forces by autograd with create_graph, backward)
/// per edge and per atom of the batch, in units of the compute dtype's
/// size; an evaluation batch (forces without create_graph) holds
/// `eval_fraction` of that. Each model factory calibrates its own
/// (crucible/models/registry.h).
struct ActivationEstimate {
  double per_edge = 0;       ///< numbers per directed pair.
  double per_atom = 0;       ///< numbers per atom.
  double eval_fraction = 1;  ///< validation batch / training batch, per edge and atom.
};

/// Activation bytes of the largest of `batches` (each a list of dataset
/// indices into `edges` and `atoms`, the directed pairs and atoms of each
/// structure): max over batches of `scale` × dtype_size × (a.per_edge ×
/// edges + a.per_atom × atoms). `scale` is 1 for training batches and
/// a.eval_fraction for validation ones. @throws std::out_of_range for an
/// index outside `edges`.
double largest_batch_activations(const ActivationEstimate& a, double scale, double dtype_size,
                                 const std::vector<int64_t>& edges, const std::vector<int64_t>& atoms,
                                 const std::vector<std::vector<int64_t>>& batches);

/// The estimated peak, in bytes, by what holds it.
struct MemoryEstimate {
  double process = 0;         ///< resident before the data was read (LibTorch, the binary).
  double structures = 0;      ///< structures_bytes (crucible/data/extxyz.h) of every file read.
  double neighbor_lists = 0;  ///< kNeighborPairBytes × pairs (training and validation).
  double training_state = 0;  ///< parameters × dtype size × state_copies.
  double state_copies = 0;    ///< training_state_copies.
  /// The largest batch's: the training batches the run draws, up to three
  /// epochs of them (the loader's seeded shuffles), validation batches in order.
  double activations = 0;
  /// What this host memory estimate leaves out, "" = nothing: the state and
  /// activations of a run on a GPU, the activations of a model whose
  /// factory gives no estimate (an imported one).
  std::string not_counted;

  double total() const { return process + structures + neighbor_lists + training_state + activations; }
  /// One line for the run's header, `available_bytes` being the memory
  /// free besides `process`: "about 1.90 GB at peak (process 0.21,
  /// structures 0.01, neighbor lists 0.02, weights/gradients/optimizer 1.65
  /// (12.5 copies), activations 0.05 for the largest batch) of 21.50 GB".
  /// Never throws.
  std::string describe(int64_t available_bytes) const;
};

/// Resident memory of this process now, bytes (/proc/self/statm; 0 where
/// unreadable). Never throws.
int64_t resident_memory_bytes();

/// @throws ConfigError with describe()'s breakdown and what to lower
///   (training.batch_size for activations, the model.<type> keys for the
///   state, model.cutoff for the neighbor lists) when the estimate beyond
///   `estimate.process` exceeds `available_bytes` (available_memory_bytes()
///   measured when `process` was).
void check_training_memory(const MemoryEstimate& estimate, int64_t available_bytes, const std::string& model_type);

}  // namespace crucible
