#pragma once
// Atomic structure: one frame of an extxyz file, in float64 and SI-like MLIP
// units (Å, eV, eV/Å, eV/Å³).

#include <ATen/ATen.h>

#include <array>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace crucible {

/// One atomic structure with optional DFT labels.
///
/// Conventions (as ASE): cell rows are lattice vectors a, b, c (Å); a cell of
/// all zeros means "no cell". Stress is the ASE sign convention (positive =
/// tensile, stress = -virial / volume), full 3x3, eV/Å³.
struct Structure {
  at::Tensor positions;       ///< [N,3] float64, Å (Cartesian).
  at::Tensor atomic_numbers;  ///< [N] int64, Z in 1..118.
  at::Tensor cell;            ///< [3,3] float64, Å, rows are lattice vectors.
  std::array<bool, 3> pbc{false, false, false};  ///< periodic along a, b, c.

  std::optional<double> energy;      ///< total energy, eV.
  std::optional<at::Tensor> forces;  ///< [N,3] float64, eV/Å.
  std::optional<at::Tensor> stress;  ///< [3,3] float64, eV/Å³ (ASE sign).

  std::string config_type = "Default";  ///< extxyz `config_type` (MACE name).
  double weight = 1.0;          ///< per-frame weight (`config_weight`).
  double energy_weight = 1.0;   ///< `config_energy_weight`.
  double forces_weight = 1.0;   ///< `config_forces_weight`.
  double stress_weight = 1.0;   ///< `config_stress_weight`.
  /// Every other header key=value pair, as the raw (unquoted) text.
  std::map<std::string, std::string> info;
  /// Extra per-atom columns [N, k] (any float dtype) that write_extxyz adds
  /// as name:R:k (e.g. crucible_forces, crucible_energies); not read back.
  std::vector<std::pair<std::string, at::Tensor>> arrays;
  /// Names of the frame's Properties columns as read (species, pos, forces,
  /// ...), for messages about missing keys; empty for other sources.
  std::vector<std::string> columns;
  /// Where the frame came from, "file:line" of its comment line (for errors).
  std::string source;

  /// Number of atoms N.
  int64_t num_atoms() const { return positions.defined() ? positions.size(0) : 0; }
  /// True when any periodic direction is set.
  bool periodic() const { return pbc[0] || pbc[1] || pbc[2]; }
  /// |det(cell)| in Å³; 0 when there is no cell.
  double volume() const;
  /// True when stress is defined (issue 47): a periodic direction and a
  /// cell of non-zero volume (a slab with c = 0 has none).
  bool has_volume() const { return periodic() && volume() > 0; }
};

}  // namespace crucible
