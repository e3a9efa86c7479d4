// Per-layer node sets of a message-passing model (issue 19).

#include "crucible/models/layer_nodes.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>

namespace crucible {

std::vector<LayerExtent> layer_extents(const Batch& batch, int64_t num_layers) {
  const int64_t n = batch.num_nodes(), e = batch.num_edges();
  std::vector<LayerExtent> out(static_cast<size_t>(num_layers), LayerExtent{n, e});
  if (batch.layer_nodes.empty()) return out;
  if (static_cast<int64_t>(batch.layer_nodes.size()) != num_layers) {
    throw std::invalid_argument("Batch::layer_nodes must have one entry per layer (" + std::to_string(num_layers) +
                                "), got " + std::to_string(batch.layer_nodes.size()));
  }
  const at::Tensor ei = batch.edge_index.to(at::kCPU, at::kLong).contiguous();
  const int64_t* recv = ei.data_ptr<int64_t>();
  const int64_t* send = recv + e;
  if (!std::is_sorted(recv, recv + e)) {
    throw std::invalid_argument("Batch::layer_nodes needs the edges sorted by receiver (edge_index[0])");
  }
  int64_t previous = n;
  for (int64_t t = 0; t < num_layers; ++t) {
    const int64_t nodes = batch.layer_nodes[static_cast<size_t>(t)];
    if (nodes < 1 || nodes > previous) {
      throw std::invalid_argument("Batch::layer_nodes must be non-increasing within [1, " + std::to_string(n) +
                                  "], got " + std::to_string(nodes) + " at layer " + std::to_string(t));
    }
    const int64_t edges = std::lower_bound(recv, recv + e, nodes) - recv;
    if (t > 0 && edges > 0 && *std::max_element(send, send + edges) >= previous) {
      throw std::invalid_argument("Batch::layer_nodes: an edge of layer " + std::to_string(t) +
                                  " has a sender outside the " + std::to_string(previous) + " nodes of layer " +
                                  std::to_string(t - 1));
    }
    out[static_cast<size_t>(t)] = {nodes, edges};
    previous = nodes;
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> compact_pairs(const at::Tensor& edge_pair, int64_t edges) {
  // The pairs used, marked and numbered in ascending order: two linear
  // passes (at::_unique sorts all `edges` indices, ~5% of a KIM step).
  const at::Tensor ep = edge_pair.slice(0, 0, edges).to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = ep.data_ptr<int64_t>();
  int64_t num_pairs = 0;
  for (int64_t e = 0; e < edges; ++e) {
    if (p[e] < 0) throw std::invalid_argument("compact_pairs: negative pair index " + std::to_string(p[e]));
    num_pairs = std::max(num_pairs, p[e] + 1);
  }
  std::vector<int64_t> local(static_cast<size_t>(num_pairs), -1);
  for (int64_t e = 0; e < edges; ++e) local[static_cast<size_t>(p[e])] = 0;
  std::vector<int64_t> used;
  for (int64_t q = 0; q < num_pairs; ++q) {
    if (local[static_cast<size_t>(q)] == 0) {
      local[static_cast<size_t>(q)] = static_cast<int64_t>(used.size());
      used.push_back(q);
    }
  }
  at::Tensor inverse = at::empty({edges}, at::kLong);
  int64_t* inv = inverse.data_ptr<int64_t>();
  for (int64_t e = 0; e < edges; ++e) inv[e] = local[static_cast<size_t>(p[e])];
  const auto dev = edge_pair.device();
  return {at::tensor(used, at::kLong).to(dev), inverse.to(dev)};
}

int64_t first_seen_pairs(const at::Tensor& edge_pair, int64_t edges) {
  const at::Tensor ep = edge_pair.slice(0, 0, edges).to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = ep.data_ptr<int64_t>();
  int64_t next = 0;  // the number of pairs seen so far
  for (int64_t e = 0; e < edges; ++e) {
    if (p[e] == next) {
      ++next;
    } else if (p[e] < 0 || p[e] > next) {
      return -1;
    }
  }
  return next;
}

PairEdges leading_pair_edges(const PairEdges& g, int64_t edges, int64_t pairs) {
  const int64_t* off = g.offsets.data_ptr<int64_t>();
  const int64_t* order = g.order.data_ptr<int64_t>();
  at::Tensor offsets = at::empty({pairs + 1}, at::kLong);
  at::Tensor kept = at::empty({edges}, at::kLong);
  int64_t* o = offsets.data_ptr<int64_t>();
  int64_t* k = kept.data_ptr<int64_t>();
  int64_t m = 0;
  o[0] = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    for (int64_t q = off[p]; q < off[p + 1]; ++q) {
      const int64_t e = order[q];
      if (e < edges) {
        if (m < edges) k[m] = e;  // more than `edges` of them (a malformed g): refused below
        ++m;
      }
    }
    o[p + 1] = m;
  }
  if (m != edges) {
    throw std::invalid_argument("leading_pair_edges: the first " + std::to_string(edges) + " edges are not all in the first " +
                                std::to_string(pairs) + " pairs (pairs not numbered by first edge)");
  }
  PairEdges out;
  out.edge_pair = g.edge_pair.slice(0, 0, edges);
  out.order = kept;
  out.offsets = offsets;
  out.receiver = g.receiver.slice(0, 0, edges);
  out.sender = g.sender.slice(0, 0, edges);
  return out;
}

void LayerPairs::update(const at::Tensor& edge_pair, int64_t num_pairs, const at::Tensor& edge_index,
                        const at::Tensor& pair_values, int64_t edges) {
  if (for_edges == edges) return;
  const bool on_cpu = edge_pair.device().is_cpu() && edge_index.device().is_cpu();
  if (edges == edge_pair.size(0)) {
    this->edges = group_edges_by_pair(edge_pair, num_pairs, edge_index);
    values = pair_values;
    own_numbering = on_cpu;  // a prefix is checked (first_seen_pairs) before a cut
  } else if (const int64_t prefix = first_seen_pairs(edge_pair, edges); prefix >= 0) {
    // Pairs numbered by their first edges (reverse_edge_pairs): the first
    // `edges` edges use exactly pairs [0, prefix), already compact; a
    // grouping of more of these edges is cut to them.
    if (own_numbering && for_edges > edges && on_cpu) {
      this->edges = leading_pair_edges(this->edges, edges, prefix);
    } else {
      this->edges = group_edges_by_pair(edge_pair.slice(0, 0, edges), prefix, edge_index.slice(1, 0, edges));
    }
    values = pair_values.slice(0, 0, prefix);
    own_numbering = on_cpu;
  } else {
    const auto [used, local] = compact_pairs(edge_pair, edges);
    this->edges = group_edges_by_pair(local, used.size(0), edge_index.slice(1, 0, edges));
    values = pair_values.index_select(0, used);
    own_numbering = false;
  }
  for_edges = edges;
}

at::Tensor leading_rows(const at::Tensor& x, int64_t n) { return x.size(0) == n ? x : x.slice(0, 0, n); }

at::Tensor pad_nodes(const at::Tensor& x, int64_t total) {
  if (x.size(0) == total) return x;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = total - x.size(0);
  return at::cat({x, at::zeros(shape, x.options())}, 0);
}

}  // namespace crucible
