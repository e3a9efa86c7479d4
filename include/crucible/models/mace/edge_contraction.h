#pragma once
// The fused gather - tensor product - scatter of MACE's interaction with
// hand-written derivatives of every order (issue 16, deliverable 3).

#include "crucible/models/filter_convolution.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace crucible::mace {

/// The four tensors of one contraction, by slot.
enum class EdgeSlot : int {
  kMessage = 0,  ///< g [N, R, C]: node features at the receiver, per row r.
  kWeights = 1,  ///< w [E, P, C]: radial weights per edge, path and channel.
  kTable = 2,    ///< T [E, R, D]: coupling table per edge (harmonics · CG).
  kInput = 3,    ///< x [N, D, C]: node features at the sender.
};

/// The scalar  S = Σ_{e,r,i,c} g[recv e, r, c] · w[e, path r, c] · T[e, r, i] · x[send e, i, c]
/// is linear in each of its four tensors; this returns ∂S/∂(slot) given the
/// other three, e.g. slot kMessage is the aggregated message
///   A[n, r, c] = Σ_{e: recv e = n} w[e, path r, c] Σ_i T[e, r, i] x[send e, i, c]
/// (MACE's conv_tp followed by scatter_sum, Batatia et al. 2022, eq. 8).
/// Every derivative of such a result is again one of the four (the cotangent
/// takes the differentiated slot), so derivatives of every order (forces,
/// then parameter gradients of a force loss) run the same fused loops
/// without [E, R, C] temporaries. CPU float32/float64 use fused loops; other
/// devices and dtypes use index_select · mul · index_add (same values).
///
/// @param slot which derivative to return; that slot's argument is ignored
///        (pass an undefined tensor).
/// @param g,w,T,x as in the enum (contiguous or not; same dtype and device).
/// @param receiver,sender [E] int64 node indices in [0, N).
/// @param row_path [R] int64 path of each row, in [0, P).
/// @param num_nodes N; @param num_paths P; @param rows R; @param dim D;
///        @param channels C (the sizes of the missing slot).
/// @param w_pairs optional: w holds one row per distance pair, [pairs, P, C],
///        and edge e reads row w_pairs->edge_pair[e] (an edge and its reverse
///        share their radial weights); the kWeights slot then returns
///        [pairs, P, C], each pair summing its edges (w_pairs->order /
///        offsets, group_edges_by_pair of these E edges, offsets on the CPU).
///        Saves the [E, P, C] gather and its scatter in the backward.
/// @throws c10::Error for mismatched shapes, devices or dtypes.
at::Tensor edge_contraction(EdgeSlot slot, const at::Tensor& g, const at::Tensor& w, const at::Tensor& T,
                            const at::Tensor& x, const at::Tensor& receiver, const at::Tensor& sender,
                            const at::Tensor& row_path, int64_t num_nodes, int64_t num_paths, int64_t rows,
                            int64_t dim, int64_t channels, const PairEdges* w_pairs = nullptr);

/// Accumulating form without autograd, for the inference path's edge
/// chunks (issue 19): `out` += the slot's derivative over the edges given
/// (`out` = for kTable). Shapes as above, with E the chunk's edges: out is
/// g-shaped [N, R, C] (kMessage), x-shaped [N, D, C] (kInput), w-shaped
/// [E, P, C] (kWeights) or T-shaped [E, R, D] (kTable). CPU float32/float64
/// tensors must be contiguous (the fused loops read them in place, so a
/// chunk never copies a node-sized tensor); other devices and dtypes use
/// the composite operations. @throws c10::Error on mismatched dtypes or
/// devices, or non-contiguous CPU tensors.
/// @param w_row optional [E] int64: edge e reads w's row w_row[e] (w then
///        [W, P, C], e.g. one row per distance pair: no [E, P, C] gather);
///        not for kWeights (c10::Error), whose rows are written.
void edge_contraction_accumulate(EdgeSlot slot, at::Tensor& out, const at::Tensor& g, const at::Tensor& w,
                                 const at::Tensor& T, const at::Tensor& x, const at::Tensor& receiver,
                                 const at::Tensor& sender, const at::Tensor& row_path,
                                 const at::Tensor& w_row = at::Tensor());

/// The first derivatives of the message slot's sum S = Σ g·A with respect
/// to x, w and T in one pass over the edges (issue 48: the inference
/// path's backward reads each edge's sender rows and cotangent rows once
/// instead of three times):
///   gx[send e, i, c]  += Σ_r T[e, r, i] w[row e, path r, c] g[recv e, r, c]
///   gw[row e, p, c]   += Σ_{r: path r = p} g[recv e, r, c] Σ_i T[e, r, i] x[send e, i, c]
///   gT[e, r, i]        = Σ_c w[row e, path r, c] g[recv e, r, c] x[send e, i, c]
/// with row e = w_row[e] (w, gw [W, P, C]) or e (w_row undefined, W = E).
/// g [N, R, C]; T, gT [E, R, D]; x, gx [N, D, C]; one dtype and device.
/// An undefined gx skips its term (x a constant, as the first layer's
/// embedding in inference).
/// Single-threaded (callers run it per chunk, each into its own gx / gw);
/// CPU float32 / float64 tensors must be contiguous; other devices and
/// dtypes run the three slots' composite operations (same values).
/// @throws c10::Error on mismatched shapes, dtypes or devices, or
///         non-contiguous CPU tensors.
void edge_contraction_backward_accumulate(at::Tensor& gx, at::Tensor& gw, at::Tensor& gT, const at::Tensor& g,
                                          const at::Tensor& w, const at::Tensor& T, const at::Tensor& x,
                                          const at::Tensor& receiver, const at::Tensor& sender,
                                          const at::Tensor& row_path, const at::Tensor& w_row = at::Tensor());

}  // namespace crucible::mace
