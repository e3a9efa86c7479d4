#pragma once
// Physical sanity of training structures (issue 15): what a DFT data set
// can hold, checked at load with the frame's file:line, before anything is
// sized from it.

#include "crucible/data/structure.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

/// Bounds of check_structures; the defaults are documented in docs/config.md.
struct StructureLimits {
  /// |x|, |y|, |z| of every position, Å. Default 1e6.
  double max_abs_coordinate = 1e6;
  /// Length of every periodic lattice vector, Å, at least. Default 0.1.
  double min_lattice_vector = 0.1;
  /// |det(cell)| / (|a| |b| |c|) of fully periodic cells (1 for a cube, ~0
  /// for linearly dependent vectors), at least. Default 1e-6.
  double min_cell_shape = 1e-6;
  /// Distance between two atoms (periodic images included), Å, at least:
  /// coincident atoms make forces infinite. Default 0.1.
  double min_distance = 0.1;
  /// |energy| / N, eV/atom, at most (all-electron energies of the heaviest
  /// elements are below 1e6). Default 1e7.
  double max_abs_energy_per_atom = 1e7;
};

/// Checks every structure: at least one atom; coordinates within
/// max_abs_coordinate; periodic lattice vectors of at least
/// min_lattice_vector and a fully periodic cell not near-singular; no two
/// atoms closer than min_distance; |energy| / N within the bound.
/// @throws DataError "<source>: <what> must be <bound>, got <value>" with
///   the frame's file:line (Structure::source; `key` and the frame index
///   when it has none), naming both atoms of a too-close pair.
void check_structures(const std::vector<Structure>& structures, const std::string& key,
                      const StructureLimits& limits = {});

/// Refuses an atom whose element is not in `known` (ascending atomic
/// numbers; empty = any): "atom 1 is Cu, an element the model was not
/// trained on (it knows Al Ti)". `atomic_numbers`: [N] int64. Used by the
/// inference paths (the Python calculator, the KIM model).
/// @throws std::invalid_argument with that message.
void check_known_elements(const std::vector<int64_t>& known, const at::Tensor& atomic_numbers);

}  // namespace crucible
