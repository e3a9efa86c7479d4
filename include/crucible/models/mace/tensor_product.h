#pragma once
// MACE's interaction: the channel-wise ("uvu") tensor product of node
// features with the edge harmonics, weighted per edge and channel by the
// radial MLP (Batatia et al., NeurIPS 2022, arXiv 2206.07697, eq. 8), issue 16.

#include "crucible/models/mace/irreps.h"

#include "crucible/models/filter_convolution.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace crucible::mace {

/// One coupling path l1 (a term of the node irreps) ⊗ l2 (a harmonic) → l3
/// (a term of the target irreps), with parity p1 · (−1)^l2 = p3.
struct TensorProductPath {
  size_t in_term = 0;      ///< index of l1 in the node irreps.
  int sh_l = 0;            ///< l2.
  Irrep out;               ///< l3 with its parity.
  size_t target_term = 0;  ///< index of l3 in the target irreps.
  int64_t mid_offset = 0;  ///< first row of this path in the message [E, Dmid, C].
  /// √(2 l3 + 1) · real_coupling(l1, l2, l3): [2l1+1, 2l2+1, 2l3+1] float64
  /// (e3nn's "component" irrep normalisation with "element" path
  /// normalisation, one path per output as MACE builds it).
  at::Tensor coupling;
};

class SparseCoupling;

/// The paths of node irreps `in` (per channel, multiplicity 1 each) with
/// harmonics 0..max_ell into `target` (per channel), in the order: by input
/// term, then harmonic, then output. Feature layout everywhere: [rows, D, C]
/// (components of all irreps of a channel along D, channels along C).
class ConvTensorProduct {
 public:
  /// The unit-norm coupling of l1 ⊗ l2 → l3, [2l1+1, 2l2+1, 2l3+1] float64.
  using CouplingSource = std::function<at::Tensor(int l1, int l2, int l3)>;

  /// `coupling` gives each path's coupling before the √(2 l3 + 1) factor;
  /// empty = real_coupling (clebsch_gordan.h, Crucible's frame). An imported
  /// MACE model passes e3nn's blocks from its file (docs/mace_import.md).
  /// @throws std::invalid_argument if an irreps has a multiplicity other
  ///         than 1, no path reaches `target`, or a given coupling has the
  ///         wrong shape.
  ConvTensorProduct(const Irreps& in, int max_ell, const Irreps& target, const CouplingSource& coupling = {});

  const std::vector<TensorProductPath>& paths() const { return paths_; }
  int64_t num_paths() const { return static_cast<int64_t>(paths_.size()); }
  /// Rows of the message: Σ over paths of 2 l3 + 1.
  int64_t mid_dim() const { return mid_dim_; }
  const Irreps& in() const { return in_; }
  const Irreps& target() const { return target_; }
  /// Input term a's coupling matrix M [Dsh, rows·(2l1+1)] float64 with
  /// edge_tables' T = Y M, and its rows' paths [rows] int64; undefined if
  /// the term has no path.
  const at::Tensor& term_coupling(size_t a) const { return term_coupling_[a]; }
  /// term_coupling(a) by its nonzeros, built once with the product (the
  /// inference engine's tables, sparse_coupling.h); null if the term has no path.
  const SparseCoupling* term_sparse_coupling(size_t a) const { return term_sparse_[a].get(); }
  const at::Tensor& term_row_path(size_t a) const { return term_row_path_[a]; }

  /// Parameter-free per-edge tables, once per structure and layer type:
  /// for each input term, T[e, r, i] = Σ_j coupling[i, j, k] Y[e, sh_off + j]
  /// over that term's paths (r runs over their rows). Y [E, (max_ell+1)²].
  /// Returns one [E, rows_t, 2l1+1] tensor per input term (undefined if the
  /// term has no path), in Y's dtype.
  std::vector<at::Tensor> edge_tables(const at::Tensor& Y) const;

  /// Input term a's paths: the indices [first, first + count) of paths()
  /// (a term's paths are consecutive).
  std::pair<int64_t, int64_t> term_path_range(size_t a) const { return term_path_range_[a]; }

  /// Fast path: the aggregated messages
  ///   A[n, row, c] = Σ_{e: receiver e = n} w[e, path(row), c] Σ_i T[e, row, i] x[sender e, i, c]
  /// by one fused edge_contraction per input term (no per-edge temporaries).
  /// x [N, D_in, C]; tables from edge_tables (in x's dtype); term_weights:
  /// per input term its paths' weights [E, count, C] (term_path_range;
  /// undefined for a term without paths), so that no [E, P, C] tensor is
  /// shared by the terms and the backward adds none; receiver / sender [E].
  /// With `w_pairs` the weights hold one row per distance pair, [pairs,
  /// count, C] (edge_contraction's w_pairs). Returns [N, mid_dim, C].
  /// @throws c10::Error on mismatched shapes.
  at::Tensor aggregate(const at::Tensor& x, const std::vector<at::Tensor>& tables,
                       const std::vector<at::Tensor>& term_weights, const at::Tensor& receiver,
                       const at::Tensor& sender, const PairEdges* w_pairs = nullptr) const;

  /// Reference path: per-edge messages [E, mid_dim, C] with a dense einsum
  /// per path (autograd only); x_sender [E, D_in, C], Y the harmonics.
  at::Tensor messages_reference(const at::Tensor& x_sender, const at::Tensor& Y,
                                const at::Tensor& weights) const;

 private:
  Irreps in_, target_;
  int max_ell_ = 0;
  std::vector<TensorProductPath> paths_;
  std::vector<std::vector<size_t>> term_paths_;  // per input term: its paths
  std::vector<at::Tensor> term_coupling_;        // per input term: [Dsh, rows·(2l1+1)] float64
  std::vector<std::shared_ptr<const SparseCoupling>> term_sparse_;  // per input term: term_coupling_ by nonzeros
  std::vector<at::Tensor> term_row_path_;        // per input term: [rows] path index
  std::vector<at::Tensor> term_row_local_path_;  // per input term: [rows] path index - first
  std::vector<std::pair<int64_t, int64_t>> term_path_range_;  // per input term: first path, count
  int64_t mid_dim_ = 0;
};

}  // namespace crucible::mace
