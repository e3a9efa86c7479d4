#pragma once
// Clebsch-Gordan coefficients and the real-basis coupling tensors of the
// MACE tensor products and symmetric contraction (issue 16).

#include <ATen/ATen.h>

namespace crucible::mace {

/// Complex-basis Clebsch-Gordan coefficients ⟨l1 m1 l2 m2 | l3 m3⟩ (Condon-
/// Shortley convention) by Racah's formula (Racah, Phys. Rev. 62, 438
/// (1942); e.g. Varshalovich et al., "Quantum Theory of Angular Momentum",
/// eq. 8.2.1): [2l1+1, 2l2+1, 2l3+1] float64 indexed by m + l; zero when the
/// triangle rule |l1 - l2| <= l3 <= l1 + l2 fails.
/// @throws std::invalid_argument if an l is outside 0..8.
at::Tensor clebsch_gordan(int l1, int l2, int l3);

/// The real-basis coupling C[i, j, k] that maps two features in the real
/// spherical-harmonic basis of spherical_harmonics() (l1, l2) to one of l3:
/// (a ⊗ b)_k = Σ_ij C[i, j, k] a_i b_j commutes with rotations,
/// C(D1 a, D2 b) = D3 C(a, b). It is U3 · CG · (U1† ⊗ U2†) with U_l the
/// complex-to-real change of basis, made real (it is real or imaginary as a
/// whole) and scaled to unit Frobenius norm. [2l1+1, 2l2+1, 2l3+1] float64;
/// zero when the triangle rule fails.
/// @throws std::invalid_argument if an l is outside 0..8.
at::Tensor real_coupling(int l1, int l2, int l3);

}  // namespace crucible::mace
