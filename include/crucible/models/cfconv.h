#pragma once
// The continuous-filter convolution's message passing with hand-written
// derivatives of every order (issue 7).

#include <ATen/ATen.h>

#include <utility>

namespace crucible {

/// v_n = Σ_{e : receiver[e] = n} h[sender[e]] ⊙ W[e]: h [N,K], W [E,K],
/// receiver/sender [E] int64 in [0, N) → v [N,K] (SchNet's cfconv sum,
/// Schütt et al., J. Chem. Phys. 148, 241722 (2018), Eq. 3). One fused pass
/// on CPU for float32/float64 (no [E,K] temporary); index_select · mul ·
/// index_add elsewhere. Derivatives are exact to any order, written with
/// the same two operations: ∂/∂h = cfconv(g, W, sender, receiver) and
/// ∂/∂W = edge_product(g, h, receiver, sender).
/// @throws c10::Error for mismatched shapes, devices or out-of-range indices.
at::Tensor cfconv(const at::Tensor& h, const at::Tensor& W, const at::Tensor& receiver,
                  const at::Tensor& sender);

/// P[e] = a[left[e]] ⊙ b[right[e]]: a [Na,K], b [Nb,K], left [E] in [0, Na),
/// right [E] in [0, Nb) → P [E,K]. Rows need not be atoms: MACE's product
/// basis multiplies monomial rows this way (symmetric_contraction.cpp).
/// Derivatives: ∂/∂a = cfconv(b, g, left, right), ∂/∂b = cfconv(a, g, right, left).
/// @throws c10::Error as cfconv.
at::Tensor edge_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& left,
                        const at::Tensor& right);

/// cfconv with one filter row per distance pair (reverse_edge_pairs):
/// v_n = Σ_{e : receiver[e] = n} h[sender[e]] ⊙ W_pairs[edge_pair[e]], with
/// W_pairs [P,K] and edge_pair [E] int64 in [0, P). Equal to
/// cfconv(h, W_pairs.index_select(0, edge_pair), receiver, sender) without
/// the [E,K] gather or, in the backward, its [E,K] scatter: ∂/∂h =
/// cfconv_pairs(g, W_pairs, sender, receiver, edge_pair), ∂/∂W_pairs =
/// edge_product_pairs(g, h, receiver, sender, edge_pair, P); exact to any order.
/// @throws c10::Error as cfconv, or if edge_pair is undefined or out of range.
at::Tensor cfconv_pairs(const at::Tensor& h, const at::Tensor& W_pairs, const at::Tensor& receiver,
                        const at::Tensor& sender, const at::Tensor& edge_pair);

/// Q[p] = Σ_{e : edge_pair[e] = p} a[left[e]] ⊙ b[right[e]]: a, b [N,K],
/// left/right/edge_pair [E] → Q [num_pairs, K] (edge_product summed per pair).
/// Derivatives: ∂/∂a = cfconv_pairs(b, g, left, right, edge_pair),
/// ∂/∂b = cfconv_pairs(a, g, right, left, edge_pair).
/// @throws c10::Error as cfconv_pairs, or if num_pairs < 0.
at::Tensor edge_product_pairs(const at::Tensor& a, const at::Tensor& b, const at::Tensor& left,
                              const at::Tensor& right, const at::Tensor& edge_pair, int64_t num_pairs);

/// Pairs of a neighbor list's edges that are each other's reverse:
/// (i, j, S) and (j, i, -S) have the same distance, so a distance-only
/// filter needs computing once per pair. edge_index [2,E] int64, shifts
/// [E,3] (integer-valued, any dtype; undefined = all zero, as in a
/// cluster), any device. Returns (edge_pair [E]:
/// the pair of each edge, representative [P]: the first edge of each pair,
/// increasing), int64 on the input's device; an edge without its reverse
/// (or a duplicated edge) is a pair alone. Computed on the CPU: edges
/// grouped by source atom, each edge's reverse searched among its
/// receiver's edges on at::parallel_for's threads: by a cursor per group
/// that only moves forward, O(E), where the edges are sorted by source and
/// every group's destinations ascend (Crucible's lists and the KIM
/// cluster's), else by a scan, O(E · neighbors). Floating-point shifts are
/// rounded.
/// @throws c10::Error on bad shapes or a negative index.
std::pair<at::Tensor, at::Tensor> reverse_edge_pairs(const at::Tensor& edge_index,
                                                     const at::Tensor& shifts);

}  // namespace crucible
