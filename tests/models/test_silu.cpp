// crucible::silu_fused (issue 19): its hand-written derivatives against at::silu
// and autograd's generic ones to second order in float64, and its one-pass
// loop against the closed forms evaluated in float64 by the C library.

#include "crucible/models/silu.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace crucible {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(Silu, ValueFirstAndSecondDerivativesMatchAutogradOfAtSilu) {
  const at::Tensor x0 = at::cat({at::linspace(-40.0, 40.0, 321, at::kDouble), at::linspace(-1e-3, 1e-3, 21, at::kDouble)});
  at::Tensor xa = x0.clone().requires_grad_(true);
  at::Tensor xb = x0.clone().requires_grad_(true);
  const at::Tensor w = at::cos(3.0 * x0);  // a non-uniform upstream gradient
  const at::Tensor ya = silu_fused(xa), yb = at::silu(xb);
  EXPECT_LT((ya - yb).abs().max().item<double>(), 1e-14);
  const at::Tensor ga = torch::autograd::grad({(ya * w).sum()}, {xa}, {}, true, true)[0];
  const at::Tensor gb = torch::autograd::grad({(yb * w).sum()}, {xb}, {}, true, true)[0];
  EXPECT_LT((ga - gb).abs().max().item<double>(), 1e-14);
  // A second-order quantity, as a force loss gives: d/dx Σ (w silu'(x))².
  const at::Tensor ha = torch::autograd::grad({ga.pow(2).sum()}, {xa})[0];
  const at::Tensor hb = torch::autograd::grad({gb.pow(2).sum()}, {xb})[0];
  EXPECT_LT((ha - hb).abs().max().item<double>(), 1e-13);
  // Closed forms: silu' = σ(1 + x(1 − σ)), silu'' = σ(1 − σ)(2 + x(1 − 2σ)).
  const at::Tensor s = at::sigmoid(x0);
  const at::Tensor d1 = s * (1.0 + x0 * (1.0 - s));
  const at::Tensor d2 = s * (1.0 - s) * (2.0 + x0 * (1.0 - 2.0 * s));
  EXPECT_LT((ga - w * d1).abs().max().item<double>(), 1e-14);
  EXPECT_LT((ha - 2.0 * w * d1 * w * d2).abs().max().item<double>(), 1e-13);
  // The gradient reaches the upstream gradient too (the force loss's path to
  // the weights before silu).
  at::Tensor wl = w.clone().requires_grad_(true);
  at::Tensor xc = x0.clone().requires_grad_(true);
  const at::Tensor gc = torch::autograd::grad({(silu_fused(xc) * wl).sum()}, {xc}, {}, true, true)[0];
  const at::Tensor dw = torch::autograd::grad({gc.sum()}, {wl})[0];
  EXPECT_LT((dw - d1).abs().max().item<double>(), 1e-14);
}

TEST(Silu, LoopMatchesLibmInEveryDtype) {
  const at::Tensor grid = at::cat({at::linspace(-90.0, 90.0, 7201, at::kDouble), at::linspace(-1e-3, 1e-3, 101, at::kDouble)});
  for (at::ScalarType dt : {at::kDouble, at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dt));
    const at::Tensor x = grid.to(dt);
    auto [y, d] = silu_and_derivative(x);
    ASSERT_EQ(y.scalar_type(), dt);
    ASSERT_EQ(d.scalar_type(), dt);
    const at::Tensor xd = x.to(at::kDouble).contiguous();
    const at::Tensor yd = y.to(at::kDouble).contiguous(), dd = d.to(at::kDouble).contiguous();
    const double ulp = dt == at::kDouble ? 1.1e-16 : dt == at::kFloat ? 6e-8 : 3.9e-3;
    // float64 / float32: a few ulps of the terms' size (silu' = σ + xσ(1 − σ)
    // passes through zero near x = −1.28); bfloat16: the rounding of the
    // float32 result, one bfloat16 ulp.
    const double k = dt == at::kBFloat16 ? 1.0 : 8.0;
    // Below x ≈ −87, σ(x) is a float32 subnormal: an absolute floor there.
    const double floor = dt == at::kDouble ? 1e-300 : 1e-41;
    for (int64_t i = 0; i < xd.numel(); ++i) {
      // 1 − σ(v) as σ(−v): no cancellation in the reference either.
      const double v = xd[i].item<double>(), s = sigmoid(v), r = sigmoid(-v);
      const double want_y = v * s, want_d = s * (1.0 + v * r);
      const double scale_d = s + std::abs(v * s * r);
      ASSERT_LE(std::abs(yd[i].item<double>() - want_y), k * ulp * std::abs(want_y) + floor) << "x = " << v;
      ASSERT_LE(std::abs(dd[i].item<double>() - want_d), k * ulp * scale_d + floor) << "x = " << v;
    }
  }
}

TEST(Silu, Bfloat16GradientsFollowFloat64ToBfloat16Precision) {
  const at::Tensor x0 = at::linspace(-8.0, 8.0, 97, at::kDouble).to(at::kBFloat16).to(at::kDouble);
  at::Tensor xb = x0.to(at::kBFloat16).requires_grad_(true);
  at::Tensor xd = x0.clone().requires_grad_(true);
  const at::Tensor w = at::sin(x0);
  const at::Tensor gb = torch::autograd::grad({(silu_fused(xb) * w.to(at::kBFloat16)).sum()}, {xb}, {}, true, true)[0];
  const at::Tensor gd = torch::autograd::grad({(at::silu(xd) * w).sum()}, {xd}, {}, true, true)[0];
  ASSERT_EQ(gb.scalar_type(), at::kBFloat16);
  EXPECT_LT((gb.to(at::kDouble) - gd).abs().max().item<double>(), 1e-2);
  const at::Tensor hb = torch::autograd::grad({gb.to(at::kFloat).pow(2).sum()}, {xb})[0];
  const at::Tensor hd = torch::autograd::grad({gd.pow(2).sum()}, {xd})[0];
  EXPECT_LT((hb.to(at::kDouble) - hd).abs().max().item<double>(), 3e-2);
}

TEST(Silu, ThirdDerivativeMatchesAutogradOfAtSilu) {
  // Beyond second order the backward switches to ATen ops (create_graph).
  const at::Tensor x0 = at::linspace(-6.0, 6.0, 49, at::kDouble);
  auto third = [&](bool fused) {
    at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor y = fused ? silu_fused(x) : at::silu(x);
    const at::Tensor g1 = torch::autograd::grad({y.sum()}, {x}, {}, true, true)[0];
    const at::Tensor g2 = torch::autograd::grad({g1.sum()}, {x}, {}, true, true)[0];
    return torch::autograd::grad({g2.sum()}, {x})[0];
  };
  const at::Tensor a = third(true), b = third(false);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-13);
  // Closed form: silu''' = σ(1 − σ)(3(1 − 2σ) + x(1 − 6σ + 6σ²)).
  const at::Tensor s = at::sigmoid(x0);
  const at::Tensor closed = s * (1.0 - s) * (3.0 * (1.0 - 2.0 * s) + x0 * (1.0 - 6.0 * s + 6.0 * s * s));
  EXPECT_LT((a - closed).abs().max().item<double>(), 1e-13);
}

}  // namespace
}  // namespace crucible
