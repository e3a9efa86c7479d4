#pragma once
// Real spherical harmonics of edge directions, l = 0..3 (issue 16).

#include <ATen/ATen.h>

namespace crucible::mace {

/// Real spherical harmonics Y_lm(r̂) for l = 0..lmax (lmax <= 3), m = -l..l.
///
/// Convention: the standard real harmonics built from the complex ones
/// with the Condon-Shortley phase (Y_l,-|m| = √2 (−1)^m Im Y_l^|m|,
/// Y_l0, Y_l,m = √2 (−1)^m Re Y_l^m), so that l = 1 is ∝ (y, z, x); see
/// e.g. Blanco, Flórez & Bermejo, J. Mol. Struct. THEOCHEM 419, 19 (1997).
/// "Component" normalisation, as MACE / e3nn use: Σ_m Y_lm(r̂)² = 2l + 1
/// for every direction (the orthonormal harmonics times √(4π)).
///
/// @param vectors [E,3] floating (Å or any length unit); each row is
///        normalised to r̂ = r / |r| when `normalize` (a zero row gives
///        r̂ = 0, hence Y = 0 for l >= 1), else used as given (must then be
///        unit length).
/// @returns [E, (lmax+1)^2] in the dtype and device of `vectors`, columns in
///        order (l, m) = (0,0), (1,-1), (1,0), (1,1), (2,-2), ...;
///        differentiable (polynomials of r̂).
/// @throws std::invalid_argument if vectors is not [E,3] floating, or lmax
///         is outside 0..3.
at::Tensor spherical_harmonics(const at::Tensor& vectors, int lmax, bool normalize = true);

/// The same harmonics for the inference engine (issue 48): one fused loop
/// over the rows, forward and a hand-written first-order backward,
///   ∂L/∂v = (g_u − (g_u · r̂) r̂) / |v|,  g_u[a] = Σ_lm ∂L/∂Y_lm · ∂Y_lm/∂u_a
/// (the polynomials' partial derivatives in u = (x, y, z), projected on
/// the plane normal to r̂ by d(v/|v|)/dv = (I − r̂ r̂ᵀ)/|v|; with
/// normalize = false, ∂L/∂v = g_u). A zero row has Y_00 only and no
/// gradient, as spherical_harmonics.
/// Arguments, result and convention as spherical_harmonics(); CPU float32
/// and float64 run the fused loop (at::parallel_for over rows), other
/// devices and dtypes return spherical_harmonics() itself.
/// @throws std::invalid_argument as spherical_harmonics();
///         std::runtime_error from the backward if a differentiable
///         backward (create_graph) is asked: the engine has no second
///         derivative (training uses spherical_harmonics()).
at::Tensor spherical_harmonics_engine(const at::Tensor& vectors, int lmax, bool normalize = true);

}  // namespace crucible::mace
