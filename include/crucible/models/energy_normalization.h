#pragma once
// Energy normalization from training data, for every model: per-element
// reference energies E0 and the scale / shift of the learned part (MACE's
// E0s and ScaleShift defaults).

#include "crucible/data/structure.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace crucible {

/// Least-squares per-element reference energies E0: minimizes
/// Σ_s (E_s - Σ_Z n_{s,Z} E0_Z)² over structures with an energy (MACE's
/// `compute_average_E0s`). Only elements present get a column of the count
/// matrix [S, P]; it is solved with LAPACK gelsd (SVD), so a rank-deficient
/// system (e.g. every structure with the same composition ratio) gets the
/// minimum-norm solution, as numpy.linalg.lstsq. Returns [max_z+1] float64
/// (eV), zero for absent elements. @throws std::invalid_argument if no
/// structure has an energy, max_z < 1, or an atomic number is outside 0..max_z.
at::Tensor fit_reference_energies(const std::vector<Structure>& structures, int64_t max_z = 118);

/// Elements whose reference energies the structures with an energy cannot
/// separate: those with a non-zero entry in a null vector of the count
/// matrix [S, P] (numerical rank as numpy.linalg.matrix_rank), e.g. Al and
/// Ti when every structure is Ti:Al 1:1. Ascending; empty for a full-rank
/// fit. Never throws for valid structures.
std::vector<int64_t> inseparable_elements(const std::vector<Structure>& structures);

/// How fit_energy_scale_shift sets the scale (MACE --scaling, mace/modules/utils.py).
enum class EnergyScaling {
  kRmsForces,  ///< rms_forces_scaling: RMS of the force components.
  kStd,        ///< std_scaling: sample std of the per-atom residual energy.
  kNone,       ///< no_scaling: 1.
};

/// "rms_forces_scaling", "std_scaling" or "no_scaling" (MACE's names).
/// @throws std::invalid_argument naming the three for any other text.
EnergyScaling parse_energy_scaling(const std::string& name);

/// Energy normalization from data: shift = mean per-atom residual energy
/// (E - ΣE0)/N (0 when `fit_shift` is false, as MACE's default model
/// "MACE"; the mean, as ScaleShiftMACE, otherwise) and scale by `scaling`:
/// RMS of force components (falls back to the population std of the
/// per-atom residual energy, then 1, if there are no forces), sample
/// (n - 1) std of the per-atom residual energy (MACE's torch_scatter
/// scatter_std), or 1. A zero or non-finite scale becomes 1 (MACE
/// _check_non_zero). Returns {scale, shift} in eV. The mean is 0 when no
/// structure has an energy. e0: [>= max Z + 1] (any float dtype, index = Z).
/// @throws std::invalid_argument if an atomic number is outside e0.
std::pair<double, double> fit_energy_scale_shift(const std::vector<Structure>& structures,
                                                 const at::Tensor& e0,
                                                 EnergyScaling scaling = EnergyScaling::kRmsForces,
                                                 bool fit_shift = true);

}  // namespace crucible
