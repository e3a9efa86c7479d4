#pragma once
// MACE's product basis: the symmetric contraction of correlation order ν
// (Batatia et al., NeurIPS 2022, arXiv 2206.07697, eqs. 10-11), issue 16.

#include "crucible/models/mace/irreps.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace crucible::mace {

/// A basis of the symmetric O(3)-equivariant polynomials of degree ν that map
/// one channel's features x ∈ V (V = `in`, every multiplicity 1, dim D) to
/// the irrep `out` (dim O):  B_k(x)_o = Σ U[o, i1..iν, k] x_i1 ... x_iν.
///
/// Built from every coupling path (l1 ⊗ l2 → L12, L12 ⊗ l3 → L, ... with the
/// real couplings of clebsch_gordan.h, parity Π p_i = out.parity),
/// symmetrised over the ν input slots, then reduced to an orthonormal basis
/// by modified Gram-Schmidt in path order (a path that adds less than 1e-9
/// of its norm is dropped), so K is the dimension of that space, ‖U_k‖_F = 1,
/// and the basis is the same on every machine (an SVD's is not: within
/// degenerate singular values it depends on the LAPACK kernels). MACE's U matrices
/// (mace/modules/symmetric_contraction.py, U_matrix_real) span the same
/// space with redundant columns.
struct SymmetricBasis {
  Irrep out;
  int nu = 1;
  int64_t num_basis = 0;   ///< K (0: no such polynomial exists).
  int64_t in_dim = 0;      ///< D.
  /// Dense U for the reference path: [O, D^ν, K] float64 (input index
  /// i1·D^(ν-1) + ... + iν), symmetric in the input indices.
  at::Tensor dense;
  /// Fast path: the monomials x_i1 ... x_iν (i1 <= ... <= iν) with a non-zero
  /// coefficient, [M, ν] int64, and their coefficients [M, O·K] float64
  /// (column o·K + k; a monomial's coefficient sums its distinct index
  /// permutations).
  at::Tensor monomials;
  at::Tensor coefficients;
};

/// The basis above for one output irrep and degree ν in 1..3. Results are
/// cached per (in, out, ν). @throws std::invalid_argument if ν is outside
/// 1..3, `in` has a multiplicity other than 1, or an l above 3.
const SymmetricBasis& symmetric_basis(const Irreps& in, const Irrep& out, int nu);

/// A basis given as a dense tensor, as an imported MACE model's U matrix
/// (mace/modules/symmetric_contraction.py, `U_matrix_ν`): U [O, D^ν, K], any
/// floating dtype (used in float64), input index i1·D^(ν-1) + ... + iν; it
/// need not be symmetric in the input indices (only its symmetric part
/// meets x ⊗ ... ⊗ x: `dense` holds that part). No column is dropped or
/// normalised: K and the weights' meaning are the file's.
/// @throws std::invalid_argument if ν is outside 1..3 or U has another shape.
SymmetricBasis symmetric_basis_from_dense(const Irrep& out, int nu, int64_t in_dim, const at::Tensor& U);

/// Reference path (dense U, autograd only): for one output irrep,
///   y[n, o, c] = Σ_ν Σ_k W_ν[n, k, c] Σ_{i..} U_ν[o, i.., k] x[n, i1, c] ... x[n, iν, c].
/// x [N, D, C]; weights[ν-1] [N, K_ν, C] (the node's element row, any K_ν may
/// be 0 with an undefined tensor); bases[ν-1] from symmetric_basis. Returns
/// [N, O, C] in x's dtype. @throws c10::Error on shape mismatch.
at::Tensor symmetric_contraction_reference(const at::Tensor& x,
                                           const std::vector<const SymmetricBasis*>& bases,
                                           const std::vector<at::Tensor>& weights);

/// The monomials of degree ν = 1..3 of every channel, shared by all output
/// irreps of a layer: the union of the bases' monomials per ν.
struct MonomialTable {
  int max_nu = 0;
  /// Per ν: [M_ν, ν] int64 monomial indices (sorted tuples, unique).
  std::vector<at::Tensor> monomials;
  /// Per ν and output irrep (in the order given to build): the coefficient
  /// matrix [O·K, M_ν] float64 (transposed, zero rows for unused monomials),
  /// undefined where K = 0.
  std::vector<std::vector<at::Tensor>> coefficients;
  std::vector<std::vector<int64_t>> num_basis;  ///< [ν][out] = K.
  std::vector<std::vector<int64_t>> out_dims;   ///< [ν][out] = O.
  /// Per ν >= 2: for each monomial of degree ν, the row of its first ν-1
  /// indices among the degree ν-1 monomials and its last index [M_ν, 2].
  std::vector<at::Tensor> parents;
};

/// Builds the shared table for the output irreps `outs` up to `max_nu`
/// (the product block of one layer). @throws as symmetric_basis.
MonomialTable monomial_table(const Irreps& in, const std::vector<Irrep>& outs, int max_nu);

/// The same table for given bases: bases[out][ν-1] for ν = 1..max_nu (all of
/// one input space; a basis with K = 0 contributes nothing).
/// @throws std::invalid_argument if an output lacks a degree.
MonomialTable monomial_table(const std::vector<std::vector<const SymmetricBasis*>>& bases, int max_nu);

/// Fast path: all output irreps of one layer, as a few dense products:
/// monomials M_ν [N, M_ν, C] built by one multiplication each from M_{ν-1},
/// then B = P_ν · M_ν ([R_ν, M_ν] × [M_ν, C] per node: one batched GEMM per
/// ν for all outputs) and the element weights. Equal to
/// symmetric_contraction_reference to rounding.
/// @param x [N, D, C].
/// @param stacked_coeffs per ν: the table's coefficient matrices of every
///        output with K > 0 concatenated along rows ([R_ν, M_ν]), in x's
///        dtype and device; undefined if no output has degree ν.
/// @param indices per ν: ν = 1 the [M_1] input index of each monomial,
///        ν >= 2 the table's `parents` [M_ν, 2]; on x's device.
/// @param weights [out][ν-1] the node's element weights [N, K, C] (undefined
///        where K = 0).
/// @returns per output irrep [N, O, C] in x's dtype.
std::vector<at::Tensor> symmetric_contraction_fast(const at::Tensor& x, const MonomialTable& table,
                                                   const std::vector<at::Tensor>& stacked_coeffs,
                                                   const std::vector<at::Tensor>& indices,
                                                   const std::vector<std::vector<at::Tensor>>& weights);

}  // namespace crucible::mace
