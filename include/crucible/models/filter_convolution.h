#pragma once
// SchNet's filter network and continuous-filter convolution fused over edge
// chunks: the inference path's kernel (issue 19, deliverable 1).

#include <ATen/ATen.h>

#include <cstdint>

namespace crucible {
namespace mace {
class RadialSpline;
}

/// One interaction's filter-generating network (SchNet, Schütt et al.,
/// J. Chem. Phys. 148, 241722 (2018), Eq. 4, schnetpack's layout):
///   W(d) = (ssp(g(d) W1ᵀ + b1) W2ᵀ + b2) · f_c(d),
///   g_k(d) = exp(-γ (d - μ_k)²),  f_c(d) = ½(cos(π d / r_c) + 1) for d < r_c, else 0,
///   ssp(x) = ln(½eˣ + ½).
/// Shapes: w1 [K,G], b1 [K], w2 [K,K], b2 [K], offsets μ [G]; one dtype.
struct FilterNetwork {
  at::Tensor w1, b1, w2, b2, offsets;
  double gamma = 0.0;   ///< Å⁻².
  double cutoff = 0.0;  ///< r_c, Å.
};

/// Edges grouped by distance pair: the edges of pair p are
/// order[offsets[p] .. offsets[p+1]). Built by `group_edges_by_pair`.
struct PairEdges {
  at::Tensor edge_pair;  ///< [E] int64: pair of each edge.
  at::Tensor order;      ///< [E] int64: edges sorted by pair (stable).
  at::Tensor offsets;    ///< [P+1] int64, on the CPU.
  at::Tensor receiver;   ///< [E] int64: edge_index[0].
  at::Tensor sender;     ///< [E] int64: edge_index[1].
};

/// Groups edges by pair (counting sort). edge_pair [E] int64 in [0, P)
/// (from reverse_edge_pairs), edge_index [2,E] int64. @throws c10::Error on
/// bad shapes or pair indices out of range.
PairEdges group_edges_by_pair(const at::Tensor& edge_pair, int64_t num_pairs, const at::Tensor& edge_index);

/// v_n = Σ_{e : receiver e = n} h[sender e] ⊙ W(d[pair e]): h [N,K], d [P]
/// pair distances (Å) → v [N,K], the dtype of h (float32 or float64; d and
/// the network in the same dtype). Equal to SchNet's autograd path.
///
/// Edges run in chunks of `chunk` pairs (inference_edge_chunk()): no tensor
/// larger than [2·chunk, K] is made, and none with an edge dimension is kept
/// for the backward, which recomputes each chunk's filter. Chunks are split
/// among at::get_num_threads() threads, each with its own [N,K] sum.
///
/// Backward: ∂/∂h and ∂/∂d, first order only, written by hand
/// (g'_k = -2γ(d - μ_k) g_k, ssp' = σ, f_c' = -½(π/r_c) sin(π d/r_c)).
///
/// With `spline` (SchNetImpl::filter_spline, the same network tabulated,
/// K outputs, h's dtype, CPU): W(d) is the spline's value and ∂/∂d its
/// slope dotted with ∂/∂W, instead of the network per pair; `net` is still
/// checked and its parameters' gradients still refused. The backward reads
/// `spline` again: it must outlive it (the model's cache keeps it, as
/// chunked_aggregate's).
/// @throws std::runtime_error from the backward if a gradient of the
///         network's parameters or a differentiable backward (create_graph)
///         is asked: that is the training path's (SchNet's autograd layers).
/// @throws c10::Error on mismatched shapes or dtypes, or a spline whose
///         outputs, dtype or device do not match h.
at::Tensor filter_convolution(const at::Tensor& h, const at::Tensor& d, const FilterNetwork& net,
                              const PairEdges& edges, int64_t chunk, const mace::RadialSpline* spline = nullptr);

}  // namespace crucible
