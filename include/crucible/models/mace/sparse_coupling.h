#pragma once
// The per-edge coupling tables of MACE's interaction, T = Y · M, from the
// nonzeros of M (issue 48, the inference engine).

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace crucible::mace {

/// One input term's coupling matrix M [Dsh, cols] (ConvTensorProduct::
/// term_coupling: the Clebsch-Gordan coefficients of its paths, cols =
/// rows · (2 l_in + 1)) kept by column, so that for a set of edges
///   T[e, j] = Σ_{k: M[k, j] ≠ 0} M[k, j] · Y[edges[e], k]
/// reads Y's rows in place (no [E, Dsh] gather) and does only the nonzero
/// products: at l ≤ 3, a column has at most 2 of the 16 harmonics (86
/// nonzeros in the 16 + 72 columns of 0e and 1o inputs, against 1408
/// products of the dense Y · M; Batatia et al. 2022, eq. 8, with T the
/// Clebsch-Gordan coefficients contracted with Y).
/// The loops run 16 edges side by side (one vector per nonzero).
class SparseCoupling {
 public:
  /// @param M [Dsh, cols] floating, any device (copied to the CPU once).
  /// @throws std::invalid_argument unless M is a defined 2-D floating tensor.
  explicit SparseCoupling(const at::Tensor& M);

  int64_t harmonics() const { return harmonics_; }  ///< Dsh
  int64_t cols() const { return cols_; }
  int64_t nonzeros() const { return static_cast<int64_t>(row_.size()); }

  /// T [Ec, cols] = Y[edges] · M. Y [E, Dsh] contiguous CPU float32 or
  /// float64; edges [Ec] contiguous int64 in [0, E); T [Ec, cols]
  /// contiguous, Y's dtype (written, not added to).
  /// @throws std::invalid_argument on mismatched shapes, dtypes, devices
  ///         or non-contiguous tensors.
  void tables(const at::Tensor& Y, const at::Tensor& edges, at::Tensor& T) const;

  /// The reverse: gY[edges[e], k] += Σ_j gT[e, j] M[k, j]. gT [Ec, cols],
  /// gY [E, Dsh]; as tables(). The rows edges[e] must be distinct (each
  /// edge once), as they are within one chunk of edges.
  /// @throws std::invalid_argument as tables().
  void tables_backward(const at::Tensor& gT, const at::Tensor& edges, at::Tensor& gY) const;

 private:
  int64_t harmonics_ = 0, cols_ = 0;
  std::vector<int64_t> start_;  // [cols + 1]: column j's nonzeros are [start_[j], start_[j + 1])
  std::vector<int64_t> row_;    // k of each nonzero
  std::vector<float> value_f_;
  std::vector<double> value_d_;
};

}  // namespace crucible::mace
