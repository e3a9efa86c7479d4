// checkpointed_rows_twice (issue 19): a per-row function evaluated chunk by
// chunk gives the values, gradients and second derivatives (a force loss's
// parameter gradients) of the same function applied at once, with autograd
// as the oracle, and never sees more rows than a chunk. Float64.

#include "crucible/models/chunk_parallel.h"
#include "crucible/precision/precision.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace crucible {
namespace {

using torch::autograd::grad;

// Per row n: y[n] = x[n]^3 · w[n] + sin(x[n]) · v[n] summed over the last
// axis, [N, 3] — not polynomial, so every order of derivative is non-trivial.
at::Tensor row_fn(const std::vector<at::Tensor>& r) {
  at::Tensor y = (r[0].pow(3) * r[1]).sum(-1);
  if (r[2].defined()) y = y + (r[0].sin() * r[2]).sum(-1);
  return y;
}

struct Derivatives {
  at::Tensor y, gx, gw, second_x, second_w, second_p;
};

/// y, then g = ∂L1/∂(x, w) with L1 = Σ y·p (create_graph, as forces), then
/// ∂L2/∂(x, w, p) with L2 = Σ g_x·a + Σ g_w·b (as a force loss).
Derivatives derivatives(bool checkpointed, int64_t chunk, bool with_v) {
  auto opt = at::TensorOptions().dtype(at::kDouble);
  at::manual_seed(3);
  const at::Tensor x = at::randn({11, 3, 2}, opt).requires_grad_(true);
  const at::Tensor w = at::randn({11, 3, 2}, opt).requires_grad_(true);
  const at::Tensor v = with_v ? at::randn({11, 3, 2}, opt).requires_grad_(true) : at::Tensor();
  const at::Tensor p = at::randn({11, 3}, opt).requires_grad_(true);
  const at::Tensor a = at::randn({11, 3, 2}, opt), b = at::randn({11, 3, 2}, opt);
  const std::vector<at::Tensor> xs{x, w, v};
  const at::Tensor y = checkpointed ? checkpointed_rows_twice(xs, chunk, [](const auto& r, int64_t, int64_t) {
    return row_fn(r);
  })
                                    : row_fn(xs);
  const auto g = grad({(y * p).sum()}, {x, w}, {}, true, /*create_graph=*/true);
  const at::Tensor l2 = (g[0] * a).sum() + (g[1] * b).sum();
  const auto s = grad({l2}, {x, w, p}, {}, false, false);
  return {y.detach(), g[0].detach(), g[1].detach(), s[0], s[1], s[2]};
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-12) << what;
  EXPECT_GT(a.abs().max().item<double>(), 1e-3) << what << " is zero: nothing was compared";
}

TEST(CheckpointedRowsTwice, ValuesFirstAndSecondDerivativesEqualTheDirectComputation) {
  for (bool with_v : {true, false}) {
    for (int64_t chunk : {1, 4, 11, 50}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + (with_v ? " with v" : " v undefined"));
      const Derivatives d = derivatives(false, 0, with_v), c = derivatives(true, chunk, with_v);
      expect_close(c.y, d.y, "y");
      expect_close(c.gx, d.gx, "dL1/dx");
      expect_close(c.gw, d.gw, "dL1/dw");
      expect_close(c.second_x, d.second_x, "dL2/dx");
      expect_close(c.second_w, d.second_w, "dL2/dw");
      expect_close(c.second_p, d.second_p, "dL2/dp");
    }
  }
}

TEST(CheckpointedRowsTwice, TwoThreadsGiveTheSameDerivatives) {
  const int before = at::get_num_threads();
  const Derivatives one = derivatives(true, 2, true);
  at::set_num_threads(2);
  const Derivatives two = derivatives(true, 2, true);
  at::set_num_threads(before);
  expect_close(two.y, one.y, "y");
  expect_close(two.second_x, one.second_x, "dL2/dx");
  expect_close(two.second_p, one.second_p, "dL2/dp");
}

/// Sets the intra-op thread count for a scope.
struct Threads {
  explicit Threads(int n) : before(at::get_num_threads()) { at::set_num_threads(n); }
  ~Threads() { at::set_num_threads(before); }
  int before;
};

// The chunks run on several threads (a translation unit built without
// -fopenmp runs at::parallel_for on the caller alone: MACE's edge kernels
// did), each with the caller's grad mode, and the per-thread sums add up.
// ATen splits the 64 chunks into two fixed halves, one per thread.
TEST(SumOverChunks, RunsOnTwoThreadsWithTheCallersGradMode) {
  Threads two(2);
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> grad_on{0};
  const at::Tensor like = at::zeros({3}, at::kDouble);
  std::vector<at::Tensor> sum;
  {
    at::NoGradGuard no_grad;
    sum = sum_over_chunks(64, {like}, [&](int64_t c, std::vector<at::Tensor>& acc) {
      acc[0].add_(static_cast<double>(c));
      if (at::GradMode::is_enabled()) ++grad_on;
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    });
  }
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(grad_on.load(), 0) << "a worker ran with grad mode on under the caller's NoGradGuard";
  EXPECT_DOUBLE_EQ(sum[0][1].item<double>(), 63.0 * 64.0 / 2.0);
}

// A chunk recomputed on a worker thread runs under the caller's autocast:
// every chunk of a bf16-autocast matrix product comes back in bfloat16.
TEST(CheckpointedRowsTwice, ChunksOnWorkersKeepTheCallersAutocast) {
  Threads two(2);
  const at::Tensor x = at::randn({64, 8}).requires_grad_(true);
  const at::Tensor w = at::randn({8, 4});
  std::mutex m;
  std::set<std::thread::id> ids;
  std::set<at::ScalarType> dtypes;
  at::Tensor y;
  {
    AutocastGuard bf16(at::kCPU, at::kBFloat16);
    y = checkpointed_rows_twice({x}, 4, [&](const std::vector<at::Tensor>& r, int64_t, int64_t) {
      at::Tensor out = at::mm(r[0], w);
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
      dtypes.insert(out.scalar_type());
      return out;
    });
  }
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(dtypes, std::set<at::ScalarType>{at::kBFloat16});
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
}

TEST(CheckpointedRowsTwice, TheFunctionNeverSeesMoreRowsThanAChunk) {
  std::atomic<int64_t> most{0}, calls{0};
  auto opt = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = at::randn({10, 3}, opt).requires_grad_(true);
  const at::Tensor y = checkpointed_rows_twice({x}, 3, [&](const std::vector<at::Tensor>& r, int64_t b, int64_t e) {
    EXPECT_EQ(r[0].size(0), e - b);
    int64_t m = most.load();
    while (e - b > m && !most.compare_exchange_weak(m, e - b)) {
    }
    ++calls;
    return (r[0].pow(3)).sum(-1);
  });
  const auto g = grad({y.sum()}, {x}, {}, true, true);
  grad({(g[0] * g[0]).sum()}, {x}, {}, false, false);
  EXPECT_EQ(most.load(), 3);
  EXPECT_EQ(calls.load(), 3 * 4);  // 4 chunks: forward, backward, double backward
}

TEST(CheckpointedRowsTwice, RefusesBadInputsAndAThirdDerivative) {
  auto opt = at::TensorOptions().dtype(at::kDouble);
  auto f = [](const std::vector<at::Tensor>& r, int64_t, int64_t) { return r[0].pow(4).sum(-1); };
  const at::Tensor x = at::randn({4, 2}, opt).requires_grad_(true);
  EXPECT_THROW(checkpointed_rows_twice({x}, 0, f), std::invalid_argument);
  EXPECT_THROW(checkpointed_rows_twice({x, at::randn({5, 2}, opt)}, 2, f), std::invalid_argument);
  EXPECT_THROW(checkpointed_rows_twice({x, at::zeros({4}, at::kLong)}, 2, f), std::invalid_argument);
  EXPECT_THROW(checkpointed_rows_twice({at::Tensor()}, 2, f), std::invalid_argument);
  const at::Tensor y = checkpointed_rows_twice({x}, 2, f);
  const auto g1 = grad({y.sum()}, {x}, {}, true, true);
  const auto g2 = grad({g1[0].sum()}, {x}, {}, true, /*create_graph=*/false);  // second order: fine
  EXPECT_LT((g2[0] - 12.0 * x.detach().pow(2)).abs().max().item<double>(), 1e-12);
  EXPECT_THROW(grad({g1[0].sum()}, {x}, {}, true, /*create_graph=*/true), std::runtime_error);
}

}  // namespace
}  // namespace crucible
