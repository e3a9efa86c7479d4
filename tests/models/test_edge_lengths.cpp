// edge_lengths (issue 48): |v| per row with a one-pass backward. Oracle:
// autograd through v.pow(2).sum(-1).sqrt(), and central finite differences.

#include "crucible/models/edge_lengths.h"
#include "models/helpers.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>

namespace crucible {
namespace {

using testing::max_abs_diff;

TEST(EdgeLengths, ValuesAndGradientEqualAutogradOfTheExpression) {
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    at::manual_seed(3);
    const at::Tensor base = at::randn({10007, 3}, dtype) * 2.0;  // several parallel blocks and a tail
    const at::Tensor g = at::randn({10007}, dtype);
    const at::Tensor a = base.clone().requires_grad_(true), b = base.clone().requires_grad_(true);
    const at::Tensor da = edge_lengths(a), db = b.pow(2).sum(-1).sqrt();
    const double tol = dtype == at::kDouble ? 1e-13 : 1e-5;
    EXPECT_LT(max_abs_diff(da.detach().to(at::kDouble), db.detach().to(at::kDouble)), tol);
    const at::Tensor ga = torch::autograd::grad({da}, {a}, {g})[0];
    const at::Tensor gb = torch::autograd::grad({db}, {b}, {g})[0];
    EXPECT_LT(max_abs_diff(ga.to(at::kDouble), gb.to(at::kDouble)), tol * 10);
    EXPECT_EQ(da.scalar_type(), dtype);
  }
}

TEST(EdgeLengths, GradientEqualsFiniteDifferencesAndIsZeroForAZeroRow) {
  const at::Tensor v = at::tensor({0.3, -1.2, 0.7, 0.0, 0.0, 0.0, 2.0, 0.5, -0.1}, at::kDouble).view({3, 3});
  const at::Tensor x = v.clone().requires_grad_(true);
  const at::Tensor w = at::tensor({0.7, 1.3, -0.4}, at::kDouble);
  const at::Tensor grad = torch::autograd::grad({(edge_lengths(x) * w).sum()}, {x})[0];
  const double eps = 1e-6;
  for (int64_t e : {0, 2}) {
    for (int64_t k = 0; k < 3; ++k) {
      at::Tensor p = v.clone(), m = v.clone();
      p[e][k] += eps;
      m[e][k] -= eps;
      const double fd = ((p.pow(2).sum(-1).sqrt() - m.pow(2).sum(-1).sqrt()) * w).sum().item<double>() / (2 * eps);
      EXPECT_NEAR(grad[e][k].item<double>(), fd, 1e-8) << e << " " << k;
    }
  }
  EXPECT_EQ(grad[1].abs().sum().item<double>(), 0.0);  // autograd's expression gives NaN there
}

TEST(EdgeLengths, RefusesBadShapesAndASecondDerivative) {
  EXPECT_THROW(edge_lengths(at::zeros({4, 2}, at::kDouble)), c10::Error);
  const at::Tensor x = at::randn({5, 3}, at::kDouble).requires_grad_(true);
  const at::Tensor d = edge_lengths(x).sum();
  EXPECT_THROW(torch::autograd::grad({d}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true), std::runtime_error);
}

}  // namespace
}  // namespace crucible
