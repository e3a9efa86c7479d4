#pragma once
// MACE's radial MLP, coupling tables and edge contraction fused over edge
// chunks: the inference path's kernel (issue 19, deliverable 1).

#include "crucible/models/filter_convolution.h"
#include "crucible/models/mace/radial_spline.h"
#include "crucible/models/mace/tensor_product.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace crucible::mace {

/// The aggregated messages of one interaction,
///   A[n, row, c] = Σ_{e: receiver e = n} w[e, path(row), c] Σ_i T[e, row, i] x[sender e, i, c],
///   w[e] = MLP(feats[pair e]),  T[e] = Y[e] · M (ConvTensorProduct::edge_tables),
/// equal to tp.aggregate(x, tp.edge_tables(Y), MLP(feats)[edge_pair], ...)
/// (Batatia et al., NeurIPS 2022, eq. 8).
///
/// x [N, D_in, C] node features (after linear_up); Y [E, (max_ell+1)²]
/// edge harmonics; feats [P, num_bessel] radial features per distance pair;
/// mlp: the radial MLP's weights with their scales folded in, [in, out]
/// each, applied as h ← silu(h W) between layers and h W last, no biases
/// (e3nn's FullyConnectedNet); the last has P_paths·C columns. One dtype
/// (float32 or float64) for all. Returns [N, mid_dim, C].
///
/// Pairs run in chunks of `chunk` (inference_edge_chunk()); no tensor with
/// an edge dimension beyond a chunk's is made, and none is kept for the
/// backward, which recomputes each chunk's weights and tables. Chunks are
/// split among at::get_num_threads() threads, each summing into its own
/// node-sized accumulators.
///
/// With a `spline` (issue 48; CPU, x's dtype), w[e] = spline(r[pair e])
/// instead of the MLP, `feats` holds the pair distances r [P, 1] and `mlp`
/// (the weights the spline was made from) is not evaluated, only refused a
/// gradient as without a spline; the backward gives ∂/∂r through the
/// spline's derivative. The spline must outlive the autograd graph. With a
/// spline (the engine), the tables T are also made from the nonzeros of M
/// column by column, reading Y's rows in place, and ∂/∂Y is written
/// straight into its rows: no [Ec, Dsh] gather or K = Dsh product per chunk.
///
/// Backward: ∂/∂x, ∂/∂Y and ∂/∂feats, first order, by hand (silu'(z) =
/// σ(z)(1 + z(1 − σ(z))), T linear in Y, the contraction's four slots).
/// @throws std::runtime_error from the backward if a gradient of an MLP
///         weight or a differentiable backward (create_graph) is asked.
/// @throws c10::Error on mismatched shapes or dtypes.
at::Tensor chunked_aggregate(const at::Tensor& x, const at::Tensor& Y, const at::Tensor& feats,
                             const std::vector<at::Tensor>& mlp, const ConvTensorProduct& tp, const PairEdges& edges,
                             int64_t chunk, const RadialSpline* spline = nullptr);

}  // namespace crucible::mace
