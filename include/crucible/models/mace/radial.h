#pragma once
// MACE's radial embedding: Bessel basis × polynomial envelope, and the
// normalised SiLU of its radial MLP (issue 16).

#include <ATen/ATen.h>

#include <cstdint>

namespace crucible::mace {

/// Bessel radial basis (DimeNet, Gasteiger et al., ICLR 2020, eq. 7; MACE's
/// BesselBasis): b_n(r) = √(2/r_max) · sin(nπr/r_max) / r, n = 1..num_basis.
/// @param r [E] distances (Å), floating, r > 0 (r = 0 gives nπ√(2/r_max)/r_max,
///        the limit).
/// @returns [E, num_basis] in r's dtype and device; differentiable.
/// @throws std::invalid_argument if r_max <= 0 or num_basis < 1.
at::Tensor bessel_basis(const at::Tensor& r, double r_max, int64_t num_basis);

/// The same basis with given frequencies w [K] and prefactor c []:
/// b_n(r) = c · sin(w_n r) / r (limit c·w_n at r = 0). An imported MACE
/// model passes its stored `bessel_weights` and `prefactor` buffers, which a
/// float32 model holds rounded to float32 (MACE evaluates those values).
/// @returns [E, K] in r's dtype; differentiable in r.
/// @throws std::invalid_argument if w is not 1-D or c not one value.
at::Tensor bessel_basis(const at::Tensor& r, const at::Tensor& frequencies, const at::Tensor& prefactor);

/// Polynomial envelope (Gasteiger et al., ICLR 2020, eq. 8; MACE's
/// PolynomialCutoff) with x = r / r_max:
///   f(x) = 1 − (p+1)(p+2)/2 · x^p + p(p+2) · x^(p+1) − p(p+1)/2 · x^(p+2)
/// for x < 1, else 0; f(1) = f'(1) = f''(1) = 0, so energies and forces are
/// continuous when a neighbor crosses r_max.
/// @param r [E] distances (Å). @returns [E] in r's dtype; differentiable.
/// @throws std::invalid_argument if r_max <= 0 or p < 1.
at::Tensor polynomial_cutoff(const at::Tensor& r, double r_max, int64_t p);

/// The same envelope of x = r / r_max (any shape and float dtype, x ≥ 0):
///   f(x) = 1 − (p+1)(p+2)/2 · x^p + p(p+2) · x^(p+1) − p(p+1)/2 · x^(p+2)
/// for x < 1, else 0. polynomial_cutoff is f(r / r_max); MACE's ZBL
/// pair_repulsion uses it with r_max = the sum of covalent radii, and an
/// imported model passes its r_max buffer as a tensor (no host read).
/// @throws std::invalid_argument if p < 1.
at::Tensor polynomial_envelope(const at::Tensor& x, int64_t p);

/// A layer's radial input, the embedding e(r) = b(r) · f(r) [P, n] of the
/// distances r [P] (Å), in its two forms (MACE's RadialEmbeddingBlock):
/// where `frequencies`, `prefactor` and `r_max` are defined (an imported
/// model's stored buffers, cast to r's dtype and device),
/// bessel_basis(r, frequencies, prefactor) · polynomial_envelope(r / r_max, p);
/// otherwise bessel_basis(r, cutoff, num_bessel) · polynomial_cutoff(r,
/// cutoff, p). Differentiable. @throws as the functions it calls.
at::Tensor radial_embedding(const at::Tensor& r, double cutoff, int64_t num_bessel, int64_t p,
                            const at::Tensor& frequencies, const at::Tensor& prefactor, const at::Tensor& r_max);

/// The factor c with E[(c · silu(z))²] = 1 for z ~ N(0, 1) (e3nn's
/// normalize2mom, which MACE's radial MLP and readout use): c ≈ 1.6765.
/// Computed once by trapezoidal quadrature on [-12, 12] (error < 1e-12).
/// Never throws.
double normalized_silu_factor();

}  // namespace crucible::mace
