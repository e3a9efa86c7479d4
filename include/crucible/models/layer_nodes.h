#pragma once
// Per-layer node sets of a message-passing model (Batch::layer_nodes,
// issue 19): where only the first nodes' energies matter (the contributing
// atoms of a KIM cluster), layer t of L needs its output only at the nodes
// within L - 1 - t hops of them. evaluate_cluster orders the nodes by that
// distance and the edges by receiver, so each layer's receivers are a prefix
// of the nodes and its edges a prefix of the edges.

#include "crucible/data/batch.h"
#include "crucible/models/filter_convolution.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace crucible {

/// What layer t computes: outputs for nodes [0, nodes) from edges [0, edges).
struct LayerExtent {
  int64_t nodes = 0;  ///< receivers whose features after this layer are needed.
  int64_t edges = 0;  ///< leading edges whose receiver is < nodes.
};

/// The extents of `num_layers` message-passing layers of `batch`: every
/// node and edge where batch.layer_nodes is empty, else layer_nodes[t] nodes
/// and the edges into them.
/// @throws std::invalid_argument where layer_nodes is given but has a size
///         other than num_layers, is not non-increasing within [1, N], the
///         receivers (edge_index[0]) are not sorted, or an edge of layer
///         t ≥ 1 has a sender outside layer t - 1's nodes.
std::vector<LayerExtent> layer_extents(const Batch& batch, int64_t num_layers);

/// The distance pairs (reverse_edge_pairs' edge_pair [E] int64) that the
/// first `edges` edges use, so a layer on fewer edges evaluates its radial
/// network on those pairs only: returns (used [P'] int64, ascending; the
/// first `edges` edges' pair indices into `used` [edges] int64), on
/// edge_pair's device; O(edges + P) on the CPU.
/// @throws std::invalid_argument on a negative pair index.
std::pair<at::Tensor, at::Tensor> compact_pairs(const at::Tensor& edge_pair, int64_t edges);

/// The number of pairs P' that the first `edges` edges of `edge_pair` ([E]
/// int64) use when these are numbered in the order of their first edges
/// (each index is at most one above all before it, as reverse_edge_pairs
/// numbers them): they are then pairs [0, P'). -1 where the numbering is
/// otherwise (compact_pairs applies). O(edges) on the CPU.
int64_t first_seen_pairs(const at::Tensor& edge_pair, int64_t edges);

/// `g` (group_edges_by_pair of some edges, on the CPU) cut to the first
/// `edges` of them and the first `pairs` pairs, where those edges use
/// exactly pairs [0, pairs) (first_seen_pairs): one pass over g's order
/// up to pair `pairs`, keeping edges below `edges`; no sort.
/// @throws std::invalid_argument if an edge below `edges` is in a pair at
///         or above `pairs` (the numbering is not by first edge).
PairEdges leading_pair_edges(const PairEdges& g, int64_t edges, int64_t pairs);

/// The inference path's pair grouping of one layer, kept across layers
/// while their edge counts agree.
struct LayerPairs {
  PairEdges edges;      ///< group_edges_by_pair of the layer's edges.
  at::Tensor values;    ///< the rows of the per-pair tensor `edges` indexes ([P', ...]).
  int64_t for_edges = -1;  ///< the edge count it was made for; -1 = none yet.
  /// Whether `edges` (on the CPU) indexes pairs by `edge_pair`'s own
  /// numbering, so that leading_pair_edges may cut it for a prefix whose
  /// pairs first_seen_pairs has checked; false after compact_pairs.
  bool own_numbering = false;

  /// Regroups for the first `edges` edges of `edge_index` [2,E] (pairs
  /// `edge_pair` [E] of `num_pairs`), with `pair_values` [P, ...] (pair
  /// distances or radial features) cut to the pairs used, unless it is
  /// already for that count. Pairs numbered by first edge
  /// (first_seen_pairs) are cut as a leading slice, without a copy, and
  /// a grouping for more edges is cut (leading_pair_edges), not redone.
  void update(const at::Tensor& edge_pair, int64_t num_pairs, const at::Tensor& edge_index,
              const at::Tensor& pair_values, int64_t edges);
};

/// The first `n` rows of `x` ([m, ...], n ≤ m): `x` itself when n == m.
at::Tensor leading_rows(const at::Tensor& x, int64_t n);

/// `x` ([n, ...], n ≤ total) padded with zero rows to [total, ...]: node
/// energies of the nodes past the last layer's, which no one reads.
at::Tensor pad_nodes(const at::Tensor& x, int64_t total);

}  // namespace crucible
