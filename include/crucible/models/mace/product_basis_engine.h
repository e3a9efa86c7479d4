#pragma once
// The inference engine's product basis (issue 48): MACE's symmetric
// contraction for every output irrep of one layer as one fused loop over
// nodes, forward and hand-written reverse, no LibTorch op per node.
//
// Per node n of element z, channel c (Batatia et al., "MACE", NeurIPS 2022,
// eq. 10-11; the monomial form of symmetric_contraction.h):
//   M_1[m]   = A[n, first[m], c]
//   M_ν[m]   = M_{ν-1}[p_m] · A[n, q_m, c]                       (ν ≥ 2)
//   y[n, i_o, c] = Σ_ν Σ_k W_{o,ν}[z, k, c] · Σ_m P_ν[(o, i, k), m] M_ν[m]
// and its reverse for ∂/∂A. The monomials of a node and a block of 32
// channels live in a local buffer (494 × 32 numbers at l ≤ 3, ν ≤ 3), so
// nothing of size [N, M_ν, C] is ever made; P_ν's nonzeros are visited row
// by row (CSR).

#include "crucible/models/mace/symmetric_contraction.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace crucible::mace {

/// The index form of one layer's product basis, built once per call from
/// its MonomialTable (CPU, plain integers and float64 coefficients).
struct ProductBasisPlan {
  int max_nu = 0;
  int64_t D = 0;                    ///< input components the monomials reach (largest index + 1).
  int64_t out_rows = 0;             ///< Σ_o O_o: rows of the joined output.
  std::vector<int32_t> first;       ///< [M_1] input component of each degree-1 monomial.
  std::vector<std::vector<int32_t>> parent, last;  ///< per ν ≥ 2: [M_ν] p_m and q_m (index 0, 1 unused).
  std::vector<int64_t> num_mono;    ///< per ν: M_ν.
  /// Per ν: P_ν's rows (CSR): row r's nonzeros are row_first[r] .. row_first[r+1]
  /// of (column, value); its output row i_o (in the joined [Σ O] rows), the
  /// output irrep o and basis function k of its weights.
  struct Degree {
    std::vector<int64_t> row_first;
    std::vector<int32_t> column;
    std::vector<double> value;
    std::vector<int32_t> out_row, out_irrep, basis;
  };
  std::vector<Degree> degrees;
};

/// Builds the plan from the table (its coefficient matrices, parents and
/// monomials). @throws std::invalid_argument if the table is empty.
ProductBasisPlan product_basis_plan(const MonomialTable& table);

/// The joined outputs [N, Σ_o O_o, C] of every output irrep of the layer
/// (their order in the table), differentiable once in A (the reverse pass
/// is the fused loop; a backward with create_graph throws, as the
/// inference path's other functions). Equal to symmetric_contraction_fast
/// (joined along dim 1) to rounding.
/// @param A [N, D, C] float32 or float64, CPU.
/// @param elem [N] int64 element index of each node into the weights' rows.
/// @param weights [o][ν-1]: [Z, K, C] in A's dtype (undefined where K = 0),
///        held constant (no gradient).
/// @throws std::invalid_argument on another device or dtype or a shape mismatch.
at::Tensor product_basis_engine(const at::Tensor& A, const at::Tensor& elem,
                                const std::vector<std::vector<at::Tensor>>& weights,
                                std::shared_ptr<const ProductBasisPlan> plan);

/// ∂/∂A of product_basis_engine for the output gradient gy [N, Σ O, C]
/// (no autograd): [N, D, C]. Exposed for the tests.
at::Tensor product_basis_engine_vjp(const at::Tensor& A, const at::Tensor& elem,
                                    const std::vector<std::vector<at::Tensor>>& weights, const ProductBasisPlan& plan,
                                    const at::Tensor& gy);

}  // namespace crucible::mace
