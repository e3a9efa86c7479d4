#pragma once
// The argument checks and the prefactors of the real spherical harmonics
// l <= 3 in component normalisation (Σ_m Y_lm² = 2l + 1), shared by the
// reference form (spherical_harmonics) and the engine's fused loop
// (spherical_harmonics_engine). Internal to src/.
//
// Y_00 = k00; l = 1: k1 (y, z, x); l = 2: k2a xy, k2a yz, k2b (3z² − 1),
// k2a xz, k2d (x² − y²); l = 3: k3c3 y(3x² − y²), k3c2 xyz, k3c1 y(5z² − 1),
// k3c0 z(5z² − 3), k3c1 x(5z² − 1), k3c2b z(x² − y²), k3c3 x(x² − 3y²).
// Each is the orthonormal harmonic's prefactor (e.g. Blanco, Flórez &
// Bermejo, J. Mol. Struct. THEOCHEM 419, 19 (1997), table 1) times √(4π).

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace crucible::mace::detail {

struct HarmonicConstants {
  double k00, k1, k2a, k2b, k2d, k3c3, k3c2, k3c1, k3c0, k3c2b;
};

inline HarmonicConstants harmonic_constants() {
  const double pi = 3.14159265358979323846;
  const double c4pi = std::sqrt(4.0 * pi);
  HarmonicConstants k;
  k.k00 = 0.5 * std::sqrt(1.0 / pi) * c4pi;
  k.k1 = std::sqrt(3.0 / (4.0 * pi)) * c4pi;
  k.k2a = 0.5 * std::sqrt(15.0 / pi) * c4pi;
  k.k2b = 0.25 * std::sqrt(5.0 / pi) * c4pi;
  k.k2d = 0.25 * std::sqrt(15.0 / pi) * c4pi;
  k.k3c3 = 0.25 * std::sqrt(35.0 / (2.0 * pi)) * c4pi;
  k.k3c2 = 0.5 * std::sqrt(105.0 / pi) * c4pi;
  k.k3c1 = 0.25 * std::sqrt(21.0 / (2.0 * pi)) * c4pi;
  k.k3c0 = 0.25 * std::sqrt(7.0 / pi) * c4pi;
  k.k3c2b = 0.25 * std::sqrt(105.0 / pi) * c4pi;
  return k;
}

/// The argument checks both forms make. @throws std::invalid_argument
/// naming `who` unless vectors is a floating [E,3] tensor and lmax in 0..3.
inline void check_harmonics_arguments(const char* who, const at::Tensor& vectors, int lmax) {
  if (!vectors.defined() || vectors.dim() != 2 || vectors.size(1) != 3 ||
      !at::isFloatingType(vectors.scalar_type())) {
    throw std::invalid_argument(std::string(who) + ": vectors must be a floating [E,3] tensor");
  }
  if (lmax < 0 || lmax > 3) {
    throw std::invalid_argument(std::string(who) + ": lmax must be in 0..3, got " + std::to_string(lmax));
  }
}

}  // namespace crucible::mace::detail
