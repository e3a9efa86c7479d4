// scale_rows / row_dot (issue 19): values against LibTorch's broadcast
// multiply and sum, derivatives to second order against autograd's generic
// ones in float64, and sums that do not depend on the data's alignment.

#include "crucible/models/row_scale.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <string>
#include <vector>

namespace crucible {
namespace {

double max_abs(const at::Tensor& x) { return x.abs().max().item<double>(); }

// Row lengths around the 16 summing lanes: none, a tail only, exact, both.
const std::vector<int64_t> kRowLengths = {1, 15, 16, 17, 64, 100};

TEST(RowScale, ScaleRowsEqualsBroadcastMultiplyBitForBit) {
  at::manual_seed(3);
  for (const int64_t K : kRowLengths) {
    for (const auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
      const at::Tensor a = at::randn({37, K}, at::kDouble).to(dtype);
      const at::Tensor s = at::randn({37}, at::kDouble).to(dtype);
      const at::Tensor want = a * s.unsqueeze(-1);  // LibTorch's kernel: bf16 via float, rounded once
      const at::Tensor got = scale_rows(a, s);
      ASSERT_EQ(got.scalar_type(), dtype);
      ASSERT_EQ(got.sizes(), a.sizes());
      EXPECT_TRUE(at::equal(got, want)) << "K " << K << " dtype " << dtype;
    }
  }
}

TEST(RowScale, RowDotAgainstFloat64SumAndAlignmentFree) {
  at::manual_seed(4);
  for (const int64_t K : kRowLengths) {
    const at::Tensor a64 = at::randn({41, K}, at::kDouble), b64 = at::randn({41, K}, at::kDouble);
    const at::Tensor want = (a64 * b64).sum(-1);
    EXPECT_LT(max_abs(row_dot(a64, b64) - want), 1e-13 * K) << "K " << K;
    // float32: within a few ulps of the products' magnitude.
    const at::Tensor a32 = a64.to(at::kFloat), b32 = b64.to(at::kFloat);
    const at::Tensor ref32 = (a32.to(at::kDouble) * b32.to(at::kDouble)).sum(-1);
    EXPECT_LT(max_abs(row_dot(a32, b32).to(at::kDouble) - ref32), 1e-6 * K) << "K " << K;
    // bfloat16: summed in float32 and rounded once, so within half a bf16
    // ulp (2^-9 relative) of the exact sum of the bf16 inputs' products.
    const at::Tensor ab = a64.to(at::kBFloat16), bb = b64.to(at::kBFloat16);
    const at::Tensor exact = (ab.to(at::kDouble) * bb.to(at::kDouble)).sum(-1);
    const at::Tensor got = row_dot(ab, bb);
    ASSERT_EQ(got.scalar_type(), at::kBFloat16);
    EXPECT_TRUE((got.to(at::kDouble) - exact).abs().le(exact.abs() * (1.0 / 256) + 1e-5 * K).all().item<bool>())
        << "K " << K;
    // The same rows at another address (a 1-row offset: K floats, not a
    // multiple of the vector width for odd K) give the same bits.
    const at::Tensor big_a = at::randn({42, K}), big_b = at::randn({42, K});
    const at::Tensor view_a = big_a.narrow(0, 1, 41), view_b = big_b.narrow(0, 1, 41);
    EXPECT_TRUE(at::equal(row_dot(view_a, view_b), row_dot(view_a.clone(), view_b.clone()))) << "K " << K;
  }
}

// L = Σ w ⊙ f(x, y); first derivatives with a graph, then the gradient of
// Σ (∂L/∂x)² + Σ (∂L/∂y)², as force training differentiates twice.
std::vector<at::Tensor> two_orders(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& f,
                                   const at::Tensor& x0, const at::Tensor& y0, const at::Tensor& w) {
  const at::Tensor x = x0.clone().requires_grad_(true), y = y0.clone().requires_grad_(true);
  const at::Tensor out = f(x, y);
  const auto g = torch::autograd::grad({(out * w).sum()}, {x, y}, {}, true, true);
  const auto h = torch::autograd::grad({g[0].pow(2).sum() + g[1].pow(2).sum()}, {x, y});
  return {out.detach(), g[0].detach(), g[1].detach(), h[0], h[1]};
}

TEST(RowScale, DerivativesToSecondOrderMatchAutogradInFloat64) {
  at::manual_seed(5);
  const at::Tensor a = at::randn({23, 17}, at::kDouble), b = at::randn({23, 17}, at::kDouble);
  const at::Tensor s = at::randn({23}, at::kDouble);
  const at::Tensor ws = at::randn({23, 17}, at::kDouble);
  const auto ours_s = two_orders([](const at::Tensor& x, const at::Tensor& y) { return scale_rows(x, y); }, a, s, ws);
  const auto ref_s =
      two_orders([](const at::Tensor& x, const at::Tensor& y) { return x * y.unsqueeze(-1); }, a, s, ws);
  for (size_t i = 0; i < ours_s.size(); ++i) EXPECT_LT(max_abs(ours_s[i] - ref_s[i]), 1e-12) << "scale_rows " << i;

  const at::Tensor w = at::randn({23}, at::kDouble);
  const auto ours_d = two_orders([](const at::Tensor& x, const at::Tensor& y) { return row_dot(x, y); }, a, b, w);
  const auto ref_d = two_orders([](const at::Tensor& x, const at::Tensor& y) { return (x * y).sum(-1); }, a, b, w);
  for (size_t i = 0; i < ours_d.size(); ++i) EXPECT_LT(max_abs(ours_d[i] - ref_d[i]), 1e-12) << "row_dot " << i;
  // Not a vacuous comparison: the second-order terms are non-zero.
  EXPECT_GT(max_abs(ref_s[3]), 0.1);
  EXPECT_GT(max_abs(ref_d[4]), 0.1);
}

TEST(RowScale, BadShapesThrowNamingTheOperation) {
  const at::Tensor a = at::zeros({4, 3});
  EXPECT_THROW(scale_rows(a, at::zeros({3})), c10::Error);
  EXPECT_THROW(scale_rows(a, at::zeros({4, 1})), c10::Error);
  EXPECT_THROW(row_dot(a, at::zeros({4, 2})), c10::Error);
  try {
    scale_rows(a, at::zeros({5}));
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("scale_rows: a [R,K] and s [R] expected"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace crucible
