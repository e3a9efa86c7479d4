#pragma once
// Cell-list neighbor list for triclinic cells with any combination of pbc.

#include <ATen/ATen.h>

#include <array>

namespace crucible {

/// Pairs (i, j, S) with |r_j - r_i + S·cell| < cutoff, as ASE's
/// `ase.neighborlist.neighbor_list("ijS", atoms, cutoff)`.
///
/// Both directions of each pair are present; there are no self-pairs
/// (i == j with S == 0), but an atom is paired with its own periodic images
/// when the cutoff exceeds a cell height. Edges are sorted by i, then j, then S.
struct NeighborList {
  at::Tensor edge_index;     ///< [2,E] int64: row 0 = i (center), row 1 = j (neighbor).
  at::Tensor shifts;         ///< [E,3] int64: integer cell shifts S.
  at::Tensor shift_vectors;  ///< [E,3] float64, Å: S · cell (rows of cell are a, b, c).
  /// Number of edges E.
  int64_t num_edges() const { return edge_index.size(1); }
};

/// Builds the neighbor list in O(N) with a cell list (binning).
///
/// @param positions [N,3] float64 (other float dtypes are converted), Å. Atoms
///                  may lie outside the cell; shifts are reported relative to
///                  these original positions (as ASE does).
/// @param cell      [3,3] float64, Å, rows are lattice vectors; ignored along
///                  non-periodic directions (may be all zeros if pbc is all false).
/// @param pbc       periodicity along each lattice vector.
/// @param cutoff    cutoff radius in Å, > 0; may exceed the cell heights
///                  (several images are then included).
/// Pair vector convention: r_ij = positions[j] - positions[i] + S · cell;
/// pairs with |r_ij| < cutoff (strict) are kept. Shifts are zero along
/// non-periodic directions.
/// @returns edges sorted by (i, j, S0, S1, S2); E = 0 gives [2,0], [0,3], [0,3].
/// @throws std::invalid_argument if shapes are wrong, a tensor is not
///         floating point, cutoff <= 0 or not finite, positions are not
///         finite, a periodic direction has a degenerate cell (zero/non-finite
///         vector or linearly dependent periodic vectors), or the cutoff would
///         span more than ~1e9 periodic images.
/// Algorithm: linked-cell method (Allen & Tildesley, "Computer Simulation of
/// Liquids", cell structures and linked lists) with triclinic binning along
/// cell heights, after ase.neighborlist.primitive_neighbor_list (ASE 3.22);
/// see src/neighbors/neighbor_list.cpp for details.
NeighborList build_neighbor_list(const at::Tensor& positions, const at::Tensor& cell,
                                 std::array<bool, 3> pbc, double cutoff);

}  // namespace crucible
