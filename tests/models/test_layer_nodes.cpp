// Batch::layer_nodes (issue 19): a model that computes its last layer only
// for the first k nodes gives those k nodes the node energies of the full
// computation, on the training path and on the inference path; and bad
// layer_nodes are refused (crucible/models/layer_nodes.h). Float64.

#include "crucible/models/cfconv.h"
#include "crucible/models/layer_nodes.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"

#include "models/helpers.h"
#include "models/small_models.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>

namespace crucible {
namespace {

/// MACE with its exact radial MLP, SchNet with its exact filter network: the
/// pruned layers are compared with the training path to 1e-12 (the splines'
/// own error is tested in test_radial_spline.cpp and
/// test_schnet_filter_spline.cpp).
std::shared_ptr<EnergyModel> make(const std::string& type) {
  if (type == "schnet") {
    auto s = testing::small_schnet(3.0);
    std::dynamic_pointer_cast<SchNetImpl>(s)->set_filter_spline(false);
    return s;
  }
  auto m = testing::small_mace(3.0);
  std::dynamic_pointer_cast<MaceImpl>(m)->set_radial_spline(false);
  return m;
}

int64_t layers_of(const EnergyModel& m) { return std::llround(m.interaction_range() / m.cutoff()); }

/// A periodic batch with its edges sorted by receiver (stable).
Batch sorted_batch(double cutoff) {
  Batch b = testing::make_batch({testing::random_periodic(10, {13, 22}, 21, 1.7)}, cutoff);
  const at::Tensor order = std::get<1>(b.edge_index[0].sort(/*stable=*/true, 0, false));
  b.edge_index = b.edge_index.index_select(1, order);
  b.shifts = b.shifts.index_select(0, order);
  return b;
}

class LayerNodesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LayerNodesTest, TheLastLayerOnKNodesGivesThemTheirFullNodeEnergies) {
  const auto model = make(GetParam());
  const int64_t L = layers_of(*model);
  ASSERT_GE(L, 2);
  const Batch full = sorted_batch(model->cutoff());
  const int64_t N = full.num_nodes(), k = 4;
  const at::Tensor reference = model->node_energies(full).detach();
  // The training path, then the inference path with small and default edge chunks.
  for (const int64_t chunk : {int64_t{0}, int64_t{3}, int64_t{1024}}) {
    const bool inference = chunk > 0;
    if (inference) set_inference_edge_chunk(chunk);
    Batch b = full;
    b.layer_nodes.assign(static_cast<size_t>(L), N);
    b.layer_nodes.back() = k;
    b.positions = full.positions.clone().requires_grad_(true);
    at::Tensor node;
    {
      std::unique_ptr<InferencePathGuard> guard;
      if (inference) guard = std::make_unique<InferencePathGuard>();
      node = model->node_energies(b);
    }
    ASSERT_EQ(node.size(0), N);
    EXPECT_LT((node.slice(0, 0, k) - reference.slice(0, 0, k)).abs().max().item<double>(), 1e-12)
        << (inference ? "inference" : "training") << " path";
    // The nodes past k get no last-layer contribution: their values differ.
    EXPECT_GT((node.slice(0, k) - reference.slice(0, k)).abs().max().item<double>(), 1e-6);
    // Forces of the first k nodes' energy: autograd through the sliced layers
    // equals autograd through the full model.
    const at::Tensor g = torch::autograd::grad({node.slice(0, 0, k).sum()}, {b.positions})[0];
    Batch c = full;
    c.positions = full.positions.clone().requires_grad_(true);
    const at::Tensor g_full = torch::autograd::grad({model->node_energies(c).slice(0, 0, k).sum()}, {c.positions})[0];
    EXPECT_LT((g - g_full).abs().max().item<double>(), 1e-12);
  }
  set_inference_edge_chunk(0);
  // Every layer on every node is the full computation.
  Batch b = full;
  b.layer_nodes.assign(static_cast<size_t>(L), N);
  EXPECT_LT((model->node_energies(b) - reference).abs().max().item<double>(), 1e-12);
}

TEST_P(LayerNodesTest, BadLayerNodesAreRefused) {
  const auto model = make(GetParam());
  const int64_t L = layers_of(*model);
  const Batch full = sorted_batch(model->cutoff());
  const int64_t N = full.num_nodes();
  Batch b = full;
  b.layer_nodes.assign(static_cast<size_t>(L + 1), N);  // one per layer expected
  EXPECT_THROW(model->node_energies(b), std::invalid_argument);
  b.layer_nodes.assign(static_cast<size_t>(L), N);
  b.layer_nodes.front() = N + 1;  // more than N
  EXPECT_THROW(model->node_energies(b), std::invalid_argument);
  b.layer_nodes.assign(static_cast<size_t>(L), 2);  // layer 1 on 2 nodes: senders outside
  EXPECT_THROW(model->node_energies(b), std::invalid_argument);
  b = full;
  b.edge_index = b.edge_index.flip(1);  // receivers no longer sorted
  b.shifts = b.shifts.flip(0);
  b.layer_nodes.assign(static_cast<size_t>(L), N);
  EXPECT_THROW(model->node_energies(b), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Models, LayerNodesTest, ::testing::Values("schnet", "mace"));

TEST(LayerNodes, PadNodesAddsZeroRows) {
  const at::Tensor x = at::arange(6, at::kDouble).view({3, 2});
  const at::Tensor y = pad_nodes(x, 5);
  ASSERT_EQ(y.size(0), 5);
  EXPECT_TRUE(at::equal(y.slice(0, 0, 3), x));
  EXPECT_EQ(y.slice(0, 3).abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(at::equal(pad_nodes(x, 3), x));
}

TEST(LayerNodes, CompactPairsEqualsTorchUniqueOverTheLeadingEdges) {
  // Oracle: at::_unique (sorted, with inverse) of the first `edges` entries.
  at::manual_seed(3);
  const at::Tensor edge_pair = at::randint(0, 40, {200}, at::kLong);
  for (const int64_t edges : {int64_t{200}, int64_t{77}, int64_t{1}, int64_t{0}}) {
    const auto [used, local] = compact_pairs(edge_pair, edges);
    const auto [want_used, want_local] = at::_unique(edge_pair.slice(0, 0, edges), true, true);
    EXPECT_TRUE(at::equal(used, want_used)) << edges;
    EXPECT_TRUE(at::equal(local, want_local.to(at::kLong))) << edges;
  }
  EXPECT_THROW(compact_pairs(at::tensor({0, -1}, at::kLong), 2), std::invalid_argument);
}

TEST(LayerNodes, GroupEdgesByPairIsAStableSortByPair) {
  // Oracle: at::sort (stable) of the pair indices and the cumulative
  // bincount, with pairs that no edge uses.
  at::manual_seed(4);
  const int64_t E = 300, P = 90;
  const at::Tensor edge_pair = at::randint(0, P, {E}, at::kLong);
  const at::Tensor edge_index = at::randint(0, 50, {2, E}, at::kLong);
  const PairEdges g = group_edges_by_pair(edge_pair, P, edge_index);
  const at::Tensor want_order = std::get<1>(edge_pair.sort(/*stable=*/true, 0, false));
  const at::Tensor want_offsets = at::cat({at::zeros({1}, at::kLong), at::bincount(edge_pair, {}, P).cumsum(0)});
  EXPECT_TRUE(at::equal(g.order, want_order));
  EXPECT_TRUE(at::equal(g.offsets, want_offsets));
  EXPECT_TRUE(at::equal(g.receiver, edge_index[0]));
  EXPECT_TRUE(at::equal(g.sender, edge_index[1]));
  EXPECT_GT(P - std::get<0>(at::_unique(edge_pair)).size(0), 0);  // some pairs are empty
  EXPECT_THROW(group_edges_by_pair(edge_pair, P - 1, edge_index), c10::Error);
  EXPECT_THROW(group_edges_by_pair(-edge_pair - 1, P, edge_index), c10::Error);
}

TEST(LayerNodes, PairsNumberedByFirstEdgeAreALeadingRangeOfEveryPrefix) {
  // reverse_edge_pairs' numbering on a periodic structure's edges: each
  // prefix uses pairs [0, P'), which compact_pairs (the oracle above)
  // confirms as the identity.
  const Batch b = testing::make_batch({testing::random_periodic(7, {22, 13}, 11)}, 4.0);
  const at::Tensor edge_pair = reverse_edge_pairs(b.edge_index, b.shifts).first;
  const int64_t E = edge_pair.size(0);
  for (const int64_t edges : {E, E / 2, E / 3 + 1, int64_t{1}, int64_t{0}}) {
    const int64_t prefix = first_seen_pairs(edge_pair, edges);
    const auto [used, local] = compact_pairs(edge_pair, edges);
    EXPECT_EQ(prefix, used.size(0)) << edges;
    EXPECT_TRUE(at::equal(used, at::arange(prefix, at::kLong))) << edges;
    EXPECT_TRUE(at::equal(local, edge_pair.slice(0, 0, edges))) << edges;
  }
  // The grouping of all edges cut to each prefix equals the prefix's own.
  const PairEdges all = group_edges_by_pair(edge_pair, first_seen_pairs(edge_pair, E), b.edge_index);
  for (const int64_t edges : {E, E / 2, E / 3 + 1, int64_t{1}, int64_t{0}}) {
    const int64_t prefix = first_seen_pairs(edge_pair, edges);
    const PairEdges want = group_edges_by_pair(edge_pair.slice(0, 0, edges), prefix, b.edge_index.slice(1, 0, edges));
    const PairEdges got = leading_pair_edges(all, edges, prefix);
    EXPECT_TRUE(at::equal(got.order, want.order)) << edges;
    EXPECT_TRUE(at::equal(got.offsets, want.offsets)) << edges;
    EXPECT_TRUE(at::equal(got.edge_pair, want.edge_pair)) << edges;
    EXPECT_TRUE(at::equal(got.receiver, want.receiver)) << edges;
    EXPECT_TRUE(at::equal(got.sender, want.sender)) << edges;
  }
  EXPECT_THROW(leading_pair_edges(all, E / 2, first_seen_pairs(edge_pair, E / 2) - 1), std::invalid_argument);
  // Other numberings are left to compact_pairs.
  EXPECT_EQ(first_seen_pairs(at::tensor({1, 0}, at::kLong), 2), -1);
  EXPECT_EQ(first_seen_pairs(at::tensor({0, 2, 1}, at::kLong), 3), -1);
  EXPECT_EQ(first_seen_pairs(at::tensor({0, -1}, at::kLong), 2), -1);
  EXPECT_EQ(first_seen_pairs(at::tensor({0, 0, 1, 0, 2, 1}, at::kLong), 6), 3);
}

}  // namespace
}  // namespace crucible
