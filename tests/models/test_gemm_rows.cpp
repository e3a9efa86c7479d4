// Issue 19: bf16 CPU products padded to row buckets give the unpadded
// product's values and derivatives.

#include "crucible/models/gemm_rows.h"
#include "crucible/precision/precision.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <set>

namespace crucible {
namespace {

TEST(GemmRows, BucketIsTheNextMultipleOfASixteenthOfThePowerOfTwoBelow) {
  EXPECT_EQ(gemm_row_bucket(0), 0);
  EXPECT_EQ(gemm_row_bucket(16), 16);
  EXPECT_EQ(gemm_row_bucket(17), 17);    // 2^4: steps of 1
  EXPECT_EQ(gemm_row_bucket(33), 34);    // 2^5: steps of 2
  EXPECT_EQ(gemm_row_bucket(5000), 5120);  // 2^12: steps of 256
  EXPECT_EQ(gemm_row_bucket(5121), 5376);
  EXPECT_EQ(gemm_row_bucket(8192), 8192);
  EXPECT_THROW(gemm_row_bucket(-1), c10::Error);
  // At most 1/16 extra rows, and few sizes over a range of row counts.
  std::set<int64_t> sizes;
  for (int64_t m = 17; m < 100000; ++m) {
    const int64_t b = gemm_row_bucket(m);
    ASSERT_GE(b, m);
    ASSERT_LE(16 * (b - m), m);
    if (m >= 5000 && m <= 5800) sizes.insert(b);
  }
  EXPECT_EQ(sizes.size(), 4u);  // 5120, 5376, 5632, 5888
}

TEST(GemmRows, WhereTheProductRunsInBf16) {
  const at::Tensor x = at::randn({5, 3}), w = at::randn({2, 3});
  EXPECT_FALSE(cpu_bf16_gemm(x, w));
  EXPECT_TRUE(cpu_bf16_gemm(x, w.to(at::kBFloat16)));
  {
    AutocastGuard bf16(at::Device(at::kCPU), at::kBFloat16);
    EXPECT_TRUE(cpu_bf16_gemm(x, w));
    EXPECT_FALSE(cpu_bf16_gemm(x.to(at::kLong), w.to(at::kLong)));
  }
  EXPECT_FALSE(cpu_bf16_gemm(x, w));
}

TEST(GemmRows, PaddedBf16LinearEqualsAtLinearToSecondOrder) {
  // Under bf16 autocast both paths multiply the same bf16 values (zero rows
  // added only), so values and derivatives agree to float32 round-off.
  at::manual_seed(3);
  const int64_t M = 37;  // bucket 38: one padded row
  ASSERT_GT(gemm_row_bucket(M), M);
  const at::Tensor x0 = at::randn({M, 8}), w = at::randn({5, 8}), b = at::randn({5});
  const at::Tensor up = at::randn({M, 5});
  std::vector<at::Tensor> results[2];
  for (int path = 0; path < 2; ++path) {
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor wp = w.clone().requires_grad_(true);
    AutocastGuard bf16(at::Device(at::kCPU), at::kBFloat16);
    at::Tensor y = path == 0 ? linear_bucketed_rows(x, wp, b) : at::linear(x, wp, b);
    ASSERT_EQ(y.sizes(), (at::IntArrayRef{M, 5}));
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    // A nonlinear loss, a first derivative with a graph, a second through it.
    at::Tensor loss = (at::tanh(y.to(at::kFloat)) * up).sum();
    auto g = torch::autograd::grad({loss}, {x, wp}, {}, true, true);
    at::Tensor q = g[0].to(at::kFloat).pow(2).sum();
    auto gg = torch::autograd::grad({q}, {wp});
    results[path] = {y.to(at::kFloat), g[0].to(at::kFloat), g[1].to(at::kFloat), gg[0].to(at::kFloat)};
  }
  for (size_t k = 0; k < results[0].size(); ++k) {
    const double scale = results[1][k].abs().max().item<double>();
    EXPECT_GT(scale, 0.01) << k;
    EXPECT_LT((results[0][k] - results[1][k]).abs().max().item<double>() / scale, 1e-6) << "quantity " << k;
  }
  // In float32 it is at::linear exactly.
  EXPECT_TRUE(at::equal(linear_bucketed_rows(x0, w, b), at::linear(x0, w, b)));
}

TEST(GemmRows, PaddedBf16MatmulOfARank3InputEqualsAtMatmul) {
  // MACE's [N, d, C] x [C, C'] products: dim 0 padded, the rest untouched.
  at::manual_seed(5);
  const int64_t N = 37;  // bucket 38
  ASSERT_GT(gemm_row_bucket(N), N);
  const at::Tensor x0 = at::randn({N, 3, 8}), w = at::randn({8, 6});
  at::Tensor xa = x0.clone().requires_grad_(true), xb = x0.clone().requires_grad_(true);
  AutocastGuard bf16(at::Device(at::kCPU), at::kBFloat16);
  const at::Tensor ya = matmul_bucketed_rows(xa, w), yb = at::matmul(xb, w);
  ASSERT_EQ(ya.sizes(), (at::IntArrayRef{N, 3, 6}));
  EXPECT_TRUE(at::equal(ya, yb));
  const at::Tensor up = at::randn({N, 3, 6});
  const at::Tensor ga = torch::autograd::grad({(ya.to(at::kFloat) * up).sum()}, {xa})[0];
  const at::Tensor gb = torch::autograd::grad({(yb.to(at::kFloat) * up).sum()}, {xb})[0];
  EXPECT_TRUE(at::equal(ga, gb));
  EXPECT_GT(ga.abs().max().item<double>(), 0.1);
}

TEST(GemmRows, RowChunkedProductEqualsAddmmToThirdOrderInFloat64) {
  // 37 rows in chunks of 8: four full chunks and a remainder of 5.
  at::manual_seed(11);
  const int64_t M = 37;
  const at::Tensor x0 = at::randn({M, 6}, at::kDouble), w0 = at::randn({6, 4}, at::kDouble);
  const at::Tensor b0 = at::randn({4}, at::kDouble), up = at::randn({M, 4}, at::kDouble);
  for (bool with_bias : {true, false}) {
    std::vector<at::Tensor> results[2];
    for (int path = 0; path < 2; ++path) {
      at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      at::Tensor b = with_bias ? b0.clone().requires_grad_(true) : at::Tensor();
      const at::Tensor y = path == 0 ? mm_row_chunks(x, w, b, 8) : (with_bias ? at::addmm(b, x, w) : at::mm(x, w));
      ASSERT_EQ(y.sizes(), (at::IntArrayRef{M, 4}));
      std::vector<at::Tensor> leaves = {x, w};
      if (with_bias) leaves.push_back(b);
      // A nonlinear loss; first derivatives with a graph; a second order
      // through them (forces, then a force loss); a third through that.
      const at::Tensor loss = (at::tanh(y) * up).sum();
      const auto g = torch::autograd::grad({loss}, leaves, {}, true, true);
      at::Tensor q = g[0].pow(2).sum() + (g[1] * g[1].sin()).sum();
      if (with_bias) q = q + g[2].pow(3).sum();
      const auto gg = torch::autograd::grad({q}, {x, w}, {}, true, true);
      const at::Tensor r = (gg[0].pow(2).sum() + gg[1].pow(2).sum());
      const auto ggg = torch::autograd::grad({r}, {x, w});
      results[path] = {y, g[0], g[1], gg[0], gg[1], ggg[0], ggg[1]};
      if (with_bias) results[path].push_back(g[2]);
    }
    for (size_t k = 0; k < results[0].size(); ++k) {
      const double scale = results[1][k].abs().max().item<double>();
      EXPECT_GT(scale, 1e-3) << k;
      EXPECT_LT((results[0][k] - results[1][k]).abs().max().item<double>() / scale, 1e-12)
          << "quantity " << k << " bias " << with_bias;
    }
  }
  EXPECT_THROW(mm_row_chunks(x0, w0.t(), b0, 8), c10::Error);  // [37,6] x [4,6]
  EXPECT_THROW(mm_row_chunks(x0, w0, at::randn({3}, at::kDouble), 8), c10::Error);
  EXPECT_THROW(mm_row_chunks(x0, w0, b0, 0), c10::Error);
}

TEST(GemmRows, TallFloatProductsGoThroughRowChunks) {
  EXPECT_EQ(gemm_chunk_rows(64, 64, 4), 8192);
  EXPECT_EQ(gemm_chunk_rows(20, 64, 8), 6241);
  EXPECT_EQ(gemm_chunk_rows(4096, 4096, 8), 256);
  EXPECT_THROW(gemm_chunk_rows(0, 64, 4), c10::Error);
  const at::Tensor w = at::randn({64, 64});
  const at::Tensor tall = at::randn({2 * 8192 + 1, 64}), short_x = at::randn({2 * 8192, 64});
  EXPECT_TRUE(row_chunked_gemm(tall, w));
  EXPECT_FALSE(row_chunked_gemm(short_x, w));                          // two chunks or fewer
  EXPECT_FALSE(row_chunked_gemm(tall.to(at::kBFloat16), w.to(at::kBFloat16)));  // bf16: row buckets
  EXPECT_FALSE(row_chunked_gemm(tall, w.to(at::kDouble)));             // mixed dtypes
  {
    AutocastGuard bf16(at::Device(at::kCPU), at::kBFloat16);
    EXPECT_FALSE(row_chunked_gemm(tall, w));
  }
  // Routed through it, linear and matmul give at::linear's / at::matmul's
  // values (the same per-row dot products).
  const at::Tensor b = at::randn({64});
  const at::Tensor ref = at::linear(tall, w, b);
  EXPECT_LT((linear_bucketed_rows(tall, w, b) - ref).abs().max().item<double>(), 1e-4 * ref.abs().max().item<double>());
  const at::Tensor x3 = at::randn({8193, 3, 64});  // 24579 rows of a rank-3 input
  const at::Tensor ref3 = at::matmul(x3, w);
  const at::Tensor y3 = matmul_bucketed_rows(x3, w);
  ASSERT_EQ(y3.sizes(), ref3.sizes());
  EXPECT_LT((y3 - ref3).abs().max().item<double>(), 1e-4 * ref3.abs().max().item<double>());
}

}  // namespace
}  // namespace crucible
