// Issue 19, deliverable 1: the inference path (ComputeOptions::training =
// false, chunked edge kernels without per-edge tensors kept for the
// backward) equals the training path (autograd layers, create_graph) in
// energy, forces and stress to 1e-10 in float64, for every chunk size and
// thread count; its backward refuses parameter gradients and create_graph.

#include "crucible/models/energy_model.h"
#include "crucible/models/filter_convolution.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "crucible/models/shifted_softplus.h"
#include "models/helpers.h"
#include "models/small_models.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <vector>

namespace crucible {
namespace {

using testing::biased_schnet;
using testing::max_abs_diff;
using testing::mixed_batch;
using testing::multi_element_mace;

void expect_paths_equal(EnergyModel& model, const Batch& batch) {
  ComputeOptions train;
  train.stress = true;
  train.training = true;
  ComputeOptions infer = train;
  infer.training = false;
  const ModelOutputs a = compute_outputs(model, batch, train);
  const ModelOutputs b = compute_outputs(model, batch, infer);
  // Scale of the values, so that a test of zeros cannot pass.
  ASSERT_GT(a.forces.abs().max().item<double>(), 1e-3);
  ASSERT_GT(a.stress.abs().max().item<double>(), 1e-5);
  EXPECT_LT(max_abs_diff(a.energy, b.energy), 1e-10);
  EXPECT_LT(max_abs_diff(a.forces, b.forces), 1e-10);
  EXPECT_LT(max_abs_diff(a.stress, b.stress), 1e-10);
  EXPECT_FALSE(b.forces.requires_grad());
  // Per-atom energies from the same evaluation: model.node_energies, and
  // their per-structure sums are the energies.
  ComputeOptions with_energies = infer;
  with_energies.energies = true;
  const ModelOutputs c = compute_outputs(model, batch, with_energies);
  at::Tensor node;
  {
    at::NoGradGuard no_grad;
    node = model.node_energies(batch);
  }
  EXPECT_LT(max_abs_diff(c.energies, node), 1e-10);
  EXPECT_LT(max_abs_diff(at::zeros_like(c.energy).index_add(0, batch.batch, c.energies), a.energy), 1e-10);
  EXPECT_LT(max_abs_diff(c.forces, a.forces), 1e-10);
}

/// Both paths for every chunk size (1, 7, the default: one chunk here) and
/// thread count; restores the defaults.
void expect_paths_equal_everywhere(EnergyModel& model) {
  const Batch batch = mixed_batch(3.5);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{0}}) {
      set_inference_edge_chunk(chunk);
      expect_paths_equal(model, batch);
    }
  }
  set_inference_edge_chunk(0);
  at::set_num_threads(1);
}

TEST(InferencePath, SchNetEqualsTrainingPathInFloat64) {
  // The exact filter network: the chunked kernels to 1e-10 (the splines'
  // error is tested in test_schnet_filter_spline.cpp).
  auto m = biased_schnet();
  std::dynamic_pointer_cast<SchNetImpl>(m)->set_filter_spline(false);
  expect_paths_equal_everywhere(*m);
}

TEST(InferencePath, MaceEqualsTrainingPathInFloat64) {
  // The exact radial MLP: the chunked kernels to 1e-10 (the splines' error
  // is tested in test_radial_spline.cpp).
  auto m = multi_element_mace();
  std::dynamic_pointer_cast<MaceImpl>(m)->set_radial_spline(false);
  expect_paths_equal_everywhere(*m);
}

TEST(InferencePath, TheModelsUseItInsideTheGuardOnly) {
  // The backward of the chunked kernels refuses parameter gradients, so a
  // parameter gradient taken through energy() tells which path ran.
  const Batch batch = mixed_batch(3.5);
  for (auto model : {biased_schnet(), multi_element_mace()}) {
    auto params = model->module().parameters();
    {
      at::Tensor e = model->energy(batch).sum();
      EXPECT_NO_THROW(torch::autograd::grad({e}, {params[0]}, {}, false, false, true));
    }
    InferencePathGuard guard;
    EXPECT_TRUE(inference_path_enabled());
    at::Tensor e = model->energy(batch).sum();
    std::vector<at::Tensor> all(params.begin(), params.end());
    EXPECT_THROW(torch::autograd::grad({e}, all, {}, false, false, true), std::exception) << model->name();
  }
  EXPECT_FALSE(inference_path_enabled());
}

TEST(InferencePath, EdgeVectorsBackwardEqualsIndexSelectsOnTwoThreads) {
  // Oracle: the edge vectors written with index_select and autograd. 50000
  // random edges (repeated atoms, self-pairs) make several 16384-edge
  // chunks, split between two threads; the cell term stays in autograd.
  at::manual_seed(3);
  const int64_t n = 300, E = 50000;
  Batch b;
  b.batch = at::zeros({n}, at::kLong);
  b.edge_index = at::randint(n, {2, E}, at::kLong);
  b.shifts = at::randint(-1, 2, {E, 3}, at::kLong).to(at::kDouble);
  const at::Tensor w = at::randn({E, 3}, at::kDouble);
  const at::Tensor pos0 = at::randn({n, 3}, at::kDouble);
  const at::Tensor cell0 = at::randn({1, 3, 3}, at::kDouble);
  const at::Tensor i = b.edge_index.select(0, 0), j = b.edge_index.select(0, 1);
  // {∂L/∂pos, ∂L/∂cell} of L = Σ w ⊙ sin(vec), then the gradient of the
  // force-like Σ (∂L/∂pos)² w.r.t. pos and cell, as force training asks.
  auto grads = [&](bool ours, bool guarded) {
    b.positions = pos0.clone().requires_grad_(true);
    b.cell = cell0.clone().requires_grad_(true);
    InferencePathGuard guard(guarded);
    const at::Tensor vec = ours ? edge_vectors(b)
                                : b.positions.index_select(0, j) - b.positions.index_select(0, i) +
                                      at::bmm(b.shifts.unsqueeze(1), b.cell.index_select(0, b.batch.index_select(0, i)))
                                          .squeeze(1);
    const at::Tensor L = (w * at::sin(vec)).sum();
    auto g = torch::autograd::grad({L}, {b.positions, b.cell}, {}, true, true);
    const auto h = torch::autograd::grad({g[0].pow(2).sum()}, {b.positions, b.cell});
    return std::vector<at::Tensor>{g[0].detach(), g[1].detach(), h[0], h[1]};
  };
  const auto expected = grads(false, false);
  ASSERT_GT(expected[0].abs().max().item<double>(), 1.0);
  ASSERT_GT(expected[2].abs().max().item<double>(), 1.0);  // second order is not vacuous
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (bool guarded : {false, true}) {
      const auto got = grads(true, guarded);
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_LT(max_abs_diff(got[k], expected[k]), 1e-10) << threads << " threads, term " << k;
      }
    }
  }
  at::set_num_threads(1);
}

TEST(InferencePath, FilterConvolutionMatchesCompositeOpsForEveryChunk) {
  // Oracle: the filter network written with autograd ops, then gather ·
  // multiply · index_add; values and first derivatives w.r.t. h and d.
  at::manual_seed(5);
  const int64_t N = 6, P = 23, K = 5, G = 4;
  const double gamma = 2.0, rc = 3.0;
  // Pairs: each twice (both directions), one alone.
  std::vector<int64_t> recv, send, pair;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t a = p % N, b = (p * 5 + 1) % N;
    recv.push_back(a); send.push_back(b); pair.push_back(p);
    if (p != 7) { recv.push_back(b); send.push_back(a); pair.push_back(p); }
  }
  const at::Tensor edge_index = at::stack({at::tensor(recv, at::kLong), at::tensor(send, at::kLong)});
  const at::Tensor edge_pair = at::tensor(pair, at::kLong);
  FilterNetwork net{at::randn({K, G}, at::kDouble), at::randn({K}, at::kDouble), at::randn({K, K}, at::kDouble),
                    at::randn({K}, at::kDouble), at::linspace(0.0, rc, G, at::kDouble), gamma, rc};
  const at::Tensor h0 = at::randn({N, K}, at::kDouble);
  at::Tensor d0 = 0.5 + 3.0 * at::rand({P}, at::kDouble);  // some beyond rc
  const at::Tensor up = at::randn({N, K}, at::kDouble);

  at::Tensor h = h0.clone().requires_grad_(true), d = d0.clone().requires_grad_(true);
  const at::Tensor rbf = at::exp(-gamma * (d.unsqueeze(-1) - net.offsets).pow(2));
  const at::Tensor a1 = at::addmm(net.b1, rbf, net.w1.t());
  const at::Tensor W = at::addmm(net.b2, shifted_softplus_reference(a1), net.w2.t()) *
                       (0.5 * (at::cos(d * (M_PI / rc)) + 1.0) * (d < rc).to(at::kDouble)).unsqueeze(-1);
  const at::Tensor v_ref = at::zeros({N, K}, at::kDouble)
                               .index_add(0, edge_index[0], h.index_select(0, edge_index[1]) *
                                                                W.index_select(0, edge_pair));
  const auto g_ref = torch::autograd::grad({(v_ref * up).sum()}, {h, d});
  ASSERT_GT(g_ref[1].abs().max().item<double>(), 1e-3);

  const PairEdges edges = group_edges_by_pair(edge_pair, P, edge_index);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{8}, P, int64_t{1000}}) {
      at::Tensor hb = h0.clone().requires_grad_(true), db = d0.clone().requires_grad_(true);
      const at::Tensor v = filter_convolution(hb, db, net, edges, chunk);
      const auto g = torch::autograd::grad({(v * up).sum()}, {hb, db});
      EXPECT_LT(max_abs_diff(v, v_ref), 1e-12) << "chunk " << chunk;
      EXPECT_LT(max_abs_diff(g[0], g_ref[0]), 1e-12) << "chunk " << chunk;
      EXPECT_LT(max_abs_diff(g[1], g_ref[1]), 1e-12) << "chunk " << chunk;
      // create_graph is the training path's.
      at::Tensor hc = h0.clone().requires_grad_(true);
      const at::Tensor vc = filter_convolution(hc, d0, net, edges, chunk);
      EXPECT_THROW(torch::autograd::grad({vc.sum()}, {hc}, {}, true, true), std::exception);
    }
  }
  at::set_num_threads(1);
}

}  // namespace
}  // namespace crucible
