#pragma once
// A sparse combination of rows: the product of a mostly-zero constant
// matrix with a tall one, as MACE's symmetric contraction needs it (issue
// 48). Its coefficient matrices P_ν [R, M] map the monomials of degree ν to
// the basis functions; they are 3-22% nonzero (a small MACE, l ≤ 3,
// correlation 3: 497 of 44 · 355 entries at ν = 3), so a dense GEMM spends
// most of its work on zeros.

#include <ATen/ATen.h>

namespace crucible {

/// out[r, :] = Σ_m a[r, m] · x[m, :] for a [R, M] (a constant: it gets no
/// gradient) and x [M, K] → [R, K] in x's dtype (a is cast to it). Only the
/// nonzero entries of a are visited, each one row update of K elements
/// (the rows of x and out are contiguous), in ascending m per row: the
/// result equals at::mm(a, x) to rounding (the sum's order differs).
/// Derivatives of every order: ∂/∂x of g is sparse_row_combination(aᵀ, g),
/// itself linear in g. CPU loops for float32 and float64; at::mm elsewhere
/// (other devices, dtypes).
/// @throws std::invalid_argument unless a and x are 2-D with a.size(1) == x.size(0).
at::Tensor sparse_row_combination(const at::Tensor& a, const at::Tensor& x);

}  // namespace crucible
