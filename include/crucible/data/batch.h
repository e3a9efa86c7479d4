#pragma once
// A batch of atomic graphs: structures concatenated into one disjoint graph.

#include "crucible/data/structure.h"
#include "crucible/neighbors/neighbor_list.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace crucible {

/// B structures with N atoms and E edges in total, concatenated.
///
/// Floating tensors share one dtype (float64 after collate; `to()` converts);
/// integer tensors are int64. Targets a structure lacks are zero there and
/// masked by the `has_*` flags. Edge vectors are
/// r_ij = positions[j] - positions[i] + shifts[e] · cell[batch[i]] (Å).
struct Batch {
  at::Tensor positions;       ///< [N,3] float, Å.
  at::Tensor atomic_numbers;  ///< [N] int64.
  at::Tensor batch;           ///< [N] int64, graph index of each atom.
  at::Tensor ptr;             ///< [B+1] int64, atoms of graph b are ptr[b]..ptr[b+1].
  at::Tensor num_atoms;       ///< [B] int64.
  at::Tensor edge_index;      ///< [2,E] int64, offset into the concatenated atoms.
  at::Tensor shifts;          ///< [E,3] float, integer-valued cell shifts S.
  at::Tensor cell;            ///< [B,3,3] float, Å, rows are lattice vectors.
  at::Tensor pbc;             ///< [B,3] bool.

  at::Tensor energy;          ///< [B] float64, eV (0 where !has_energy); Batch::to keeps it float64.
  at::Tensor forces;          ///< [N,3] float, eV/Å (0 where !has_forces).
  at::Tensor stress;          ///< [B,3,3] float, eV/Å³ (0 where !has_stress).
  at::Tensor has_energy;      ///< [B] bool.
  at::Tensor has_forces;      ///< [B] bool.
  at::Tensor has_stress;      ///< [B] bool.
  at::Tensor weight;          ///< [B] float, per-structure weight.
  at::Tensor energy_weight;   ///< [B] float.
  at::Tensor forces_weight;   ///< [B] float.
  at::Tensor stress_weight;   ///< [B] float.
  std::vector<std::string> config_types;  ///< [B] config_type of each structure.
  /// Optional, one entry per message-passing layer (non-increasing): layer
  /// t's output is needed only at nodes [0, layer_nodes[t]), whose edges
  /// come first (edges sorted by receiver). evaluate_cluster sets it for a
  /// KIM cluster ordered by hops from the contributing atoms; models that
  /// honour it (SchNet, MACE; crucible/models/layer_nodes.h) then compute
  /// each layer only there, and the node energies past the last layer's
  /// nodes are meaningless. Empty (collate's default) = every node.
  std::vector<int64_t> layer_nodes;

  /// Number of structures B.
  int64_t num_graphs() const { return num_atoms.size(0); }
  /// Total number of atoms N.
  int64_t num_nodes() const { return positions.size(0); }
  /// Total number of edges E.
  int64_t num_edges() const { return edge_index.size(1); }
  /// Copy on `device` with floating tensors cast to `dtype` (kFloat/kDouble/...),
  /// except the energy labels, which stay float64.
  Batch to(at::Device device, at::ScalarType dtype) const;
};

/// Collates structures with their precomputed neighbor lists into one Batch
/// (float64, CPU). @throws std::invalid_argument if the lists differ in length
/// or are empty.
Batch collate(const std::vector<const Structure*>& structures,
              const std::vector<const NeighborList*>& neighbor_lists);

}  // namespace crucible
