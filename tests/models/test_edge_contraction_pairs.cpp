// Issue 19: MACE's edge contraction with one radial-weight row per distance
// pair equals the contraction with the weights gathered to edges, for every
// slot and through second derivatives, on 1 and 2 threads.

#include "crucible/models/filter_convolution.h"
#include "crucible/models/mace/edge_contraction.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace crucible::mace {
namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-300, b.abs().max().item<double>());
}

TEST(EdgeContractionPairs, PairRowsEqualGatheredRowsToSecondOrder) {
  const int threads = at::get_num_threads();
  for (int nt : {1, 2}) {
    at::set_num_threads(nt);
    at::manual_seed(7);
    const int64_t N = 6, E = 700, Pp = 300, P = 3, R = 5, D = 3, C = 18;
    const at::Tensor recv = at::randint(0, N, {E}, at::kLong), send = at::randint(0, N, {E}, at::kLong);
    const at::Tensor pair = at::randint(0, Pp, {E}, at::kLong);
    const at::Tensor row_path = at::tensor(std::vector<int64_t>{0, 0, 1, 2, 2}, at::kLong);
    const PairEdges grouped = group_edges_by_pair(pair, Pp, at::stack({recv, send}));
    const auto opt = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor g0 = at::randn({N, R, C}, opt), wp0 = at::randn({Pp, P, C}, opt);
    const at::Tensor T0 = at::randn({E, R, D}, opt), x0 = at::randn({N, D, C}, opt);
    // Each slot given the other three: pairs against gathered weights.
    const at::Tensor we = wp0.index_select(0, pair);
    for (EdgeSlot slot : {EdgeSlot::kMessage, EdgeSlot::kInput, EdgeSlot::kTable}) {
      const at::Tensor a = edge_contraction(slot, g0, wp0, T0, x0, recv, send, row_path, N, P, R, D, C, &grouped);
      const at::Tensor b = edge_contraction(slot, g0, we, T0, x0, recv, send, row_path, N, P, R, D, C);
      EXPECT_LT(rel(a, b), 1e-12) << "slot " << static_cast<int>(slot) << " threads " << nt;
    }
    // kWeights: per pair, the sum of its edges' rows.
    const at::Tensor gw = edge_contraction(EdgeSlot::kWeights, g0, at::Tensor(), T0, x0, recv, send, row_path, N, P, R,
                                           D, C, &grouped);
    ASSERT_EQ(gw.sizes(), (at::IntArrayRef{Pp, P, C}));
    const at::Tensor ge = edge_contraction(EdgeSlot::kWeights, g0, at::Tensor(), T0, x0, recv, send, row_path, N, P, R,
                                           D, C);
    EXPECT_LT(rel(gw, at::zeros({Pp, P, C}, opt).index_add(0, pair, ge)), 1e-12) << "threads " << nt;
    // Second order through the message slot: d/dw and d/dT of a loss of the
    // first derivative with respect to x.
    std::vector<at::Tensor> results[2];
    for (int path = 0; path < 2; ++path) {
      at::Tensor wp = wp0.clone().requires_grad_(true), T = T0.clone().requires_grad_(true);
      at::Tensor x = x0.clone().requires_grad_(true);
      const at::Tensor A = path == 0
          ? edge_contraction(EdgeSlot::kMessage, at::Tensor(), wp, T, x, recv, send, row_path, N, P, R, D, C, &grouped)
          : edge_contraction(EdgeSlot::kMessage, at::Tensor(), wp.index_select(0, pair), T, x, recv, send, row_path, N,
                             P, R, D, C);
      const at::Tensor gx = torch::autograd::grad({(A * g0).sum()}, {x}, {}, true, true)[0];
      auto gg = torch::autograd::grad({gx.pow(2).sum()}, {wp, T});
      results[path] = {A, gx, gg[0], gg[1]};
    }
    for (size_t k = 0; k < results[0].size(); ++k) {
      EXPECT_GT(results[1][k].abs().max().item<double>(), 0.0) << k;
      EXPECT_LT(rel(results[0][k], results[1][k]), 1e-12) << "quantity " << k << " threads " << nt;
    }
  }
  at::set_num_threads(threads);
}

}  // namespace
}  // namespace crucible::mace

namespace crucible::mace {
namespace {

// Issue 19: float32 with 32, 64 or 128 channels runs loops with a
// compile-time channel count; each slot, with and without weight pairs,
// against the generic loops in float64 on the same inputs (and 48 channels,
// the generic float32 loops).
TEST(EdgeContractionPairs, FixedChannelFloatLoopsMatchFloat64) {
  for (int64_t C : {32, 64, 128, 48}) {
    SCOPED_TRACE(C);
    at::manual_seed(11);
    const int64_t N = 7, E = 400, Pp = 150, P = 3, R = 5, D = 3;
    const at::Tensor recv = at::randint(0, N, {E}, at::kLong), send = at::randint(0, N, {E}, at::kLong);
    const at::Tensor pair = at::randint(0, Pp, {E}, at::kLong);
    const at::Tensor row_path = at::tensor(std::vector<int64_t>{0, 1, 1, 2, 0}, at::kLong);
    const PairEdges grouped = group_edges_by_pair(pair, Pp, at::stack({recv, send}));
    const at::Tensor g = at::randn({N, R, C}), wp = at::randn({Pp, P, C});
    const at::Tensor T = at::randn({E, R, D}), x = at::randn({N, D, C});
    const at::Tensor we = wp.index_select(0, pair);
    auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
    for (bool paired : {false, true}) {
      const at::Tensor& w = paired ? wp : we;
      const PairEdges* pe = paired ? &grouped : nullptr;
      for (EdgeSlot slot : {EdgeSlot::kMessage, EdgeSlot::kInput, EdgeSlot::kTable, EdgeSlot::kWeights}) {
        auto arg = [&](EdgeSlot k, const at::Tensor& t) { return k == slot ? at::Tensor() : t; };
        const at::Tensor f = edge_contraction(slot, arg(EdgeSlot::kMessage, g), arg(EdgeSlot::kWeights, w),
                                              arg(EdgeSlot::kTable, T), arg(EdgeSlot::kInput, x), recv, send, row_path,
                                              N, P, R, D, C, pe);
        const at::Tensor r = edge_contraction(slot, arg(EdgeSlot::kMessage, d(g)), arg(EdgeSlot::kWeights, d(w)),
                                              arg(EdgeSlot::kTable, d(T)), arg(EdgeSlot::kInput, d(x)), recv, send,
                                              row_path, N, P, R, D, C, pe);
        ASSERT_EQ(f.scalar_type(), at::kFloat);
        EXPECT_GT(r.abs().max().item<double>(), 0.0);
        EXPECT_LT(rel(d(f), r), 1e-5) << "slot " << static_cast<int>(slot) << " paired " << paired;
      }
    }
  }
}

}  // namespace
}  // namespace crucible::mace

namespace crucible::mace {
namespace {

// Issue 48: the inference backward's one-pass derivatives (x, per-pair w
// and T together) equal autograd through the message written with plain
// tensor operations (einsum, gather by index), float64 and float32 at the
// fixed and generic channel counts, with and without per-pair rows, and
// accumulate into gx / gw.
TEST(EdgeContractionPairs, OnePassBackwardEqualsAutogradOfTheMessage) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (int64_t C : {32, 20}) {
      for (bool pairs : {true, false}) {
        SCOPED_TRACE(std::to_string(C) + (pairs ? " pairs " : " edges ") + c10::toString(dtype));
        at::manual_seed(11);
        const int64_t N = 7, E = 300, Pp = 120, P = 3, R = 6, D = 3;
        const auto opt = at::TensorOptions().dtype(at::kDouble);
        const at::Tensor recv = at::randint(0, N, {E}, at::kLong), send = at::randint(0, N, {E}, at::kLong);
        const at::Tensor row = pairs ? at::randint(0, Pp, {E}, at::kLong) : at::arange(E, at::kLong);
        const int64_t W = pairs ? Pp : E;
        const at::Tensor row_path = at::tensor(std::vector<int64_t>{0, 1, 1, 2, 0, 2}, at::kLong);
        const at::Tensor g = at::randn({N, R, C}, opt), w0 = at::randn({W, P, C}, opt);
        const at::Tensor T0 = at::randn({E, R, D}, opt), x0 = at::randn({N, D, C}, opt);
        // Oracle: S = Σ g[recv] · w[row][:, path] · (T x[send]) by einsum, autograd in float64.
        at::Tensor w = w0.clone().requires_grad_(true), T = T0.clone().requires_grad_(true);
        at::Tensor x = x0.clone().requires_grad_(true);
        const at::Tensor msg = at::einsum("eri,eic->erc", {T, x.index_select(0, send)}) *
                               w.index_select(0, row).index_select(1, row_path);
        const at::Tensor S = (g.index_select(0, recv) * msg).sum();
        const auto grads = torch::autograd::grad({S}, {x, w, T});
        // The one-pass kernel, accumulating onto a nonzero start in gx and gw.
        const at::Tensor gx_start = at::randn({N, D, C}, opt), gw_start = at::randn({W, P, C}, opt);
        at::Tensor gx = gx_start.to(dtype).clone(), gw = gw_start.to(dtype).clone(), gT = at::empty({E, R, D}, dtype);
        edge_contraction_backward_accumulate(gx, gw, gT, g.to(dtype), w0.to(dtype), T0.to(dtype), x0.to(dtype), recv,
                                             send, row_path, pairs ? row : at::Tensor());
        const double tol = dtype == at::kDouble ? 1e-12 : 2e-5;
        EXPECT_LT(rel(gx.to(at::kDouble) - gx_start, grads[0]), tol);
        EXPECT_LT(rel(gw.to(at::kDouble) - gw_start, grads[1]), tol);
        EXPECT_LT(rel(gT.to(at::kDouble), grads[2]), tol);
        // Without gx (x a constant): the same gw and gT, bit for bit.
        at::Tensor no_gx, gw2 = gw_start.to(dtype).clone(), gT2 = at::empty({E, R, D}, dtype);
        edge_contraction_backward_accumulate(no_gx, gw2, gT2, g.to(dtype), w0.to(dtype), T0.to(dtype), x0.to(dtype),
                                             recv, send, row_path, pairs ? row : at::Tensor());
        EXPECT_TRUE(at::equal(gw2, gw));
        EXPECT_TRUE(at::equal(gT2, gT));
        // The forward slot reading per-pair rows equals the einsum message's scatter.
        at::Tensor A = at::zeros({N, R, C}, dtype);
        edge_contraction_accumulate(EdgeSlot::kMessage, A, at::Tensor(), w0.to(dtype), T0.to(dtype), x0.to(dtype),
                                    recv, send, row_path, pairs ? row : at::Tensor());
        EXPECT_LT(rel(A.to(at::kDouble), at::zeros({N, R, C}, opt).index_add(0, recv, msg.detach())), tol);
      }
    }
  }
}

}  // namespace
}  // namespace crucible::mace
