#pragma once
// data.e0s (issue 18): where a run's per-element reference energies E0 come
// from: a least-squares fit on the training energies, the training file's
// isolated-atom frames, zero, a map or a JSON file (MACE's E0s options).

#include "crucible/config/config.h"
#include "crucible/data/structure.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace crucible {

/// True for an isolated-atom frame: config_type IsolatedAtom (MACE's
/// convention), or one atom with no periodic direction (with or without a
/// cell). Never throws.
bool is_isolated_atom(const Structure& s);

/// Moves the isolated-atom frames out of `frames` (keeping the others in
/// order) and returns them. Never throws.
std::vector<Structure> take_isolated_atoms(std::vector<Structure>& frames);

/// The E0s of a run and where they came from.
struct E0Choice {
  at::Tensor e0;        ///< [119] float64, eV, index = Z; zero for elements not in the run.
  std::string source;   ///< for model.json "e0_source" and the run summary.
  std::string warning;  ///< "" or one line (a rank-deficient least-squares fit).
};

/// The E0s that `setting` asks for, for the training `elements`.
/// - least_squares: fit_reference_energies on `train` (zero E0s without
///   energies); when every structure has some elements in the same
///   proportions (inseparable_elements), NumPy's minimum-norm solution is
///   kept and `warning` names them and suggests isolated or a map.
/// - isolated: the energies of `isolated` (from take_isolated_atoms).
/// - zero; map; file (JSON object of symbol or Z to eV, path relative to
///   the working directory).
/// @throws ConfigError naming data.e0s: an element of `elements` without an
///         E0 (listing those given), an isolated frame without an energy or two
///         of one element with different energies (naming their file:line), an
///         unreadable or malformed JSON file, a non-finite value.
E0Choice choose_e0s(const E0Setting& setting, const std::vector<Structure>& train,
                    const std::vector<Structure>& isolated, const std::set<int64_t>& elements);

}  // namespace crucible
