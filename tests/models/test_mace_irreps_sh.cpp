// Issue 16 building blocks: irreps text as MACE writes it, and real
// spherical harmonics checked against SciPy (independent oracle), their
// normalisation, parity and rotation equivariance.

#include "common/python_oracle.h"
#include "crucible/common/error.h"
#include "crucible/models/mace/clebsch_gordan.h"
#include "crucible/models/mace/irreps.h"
#include "crucible/models/mace/spherical_harmonics.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace crucible {
namespace {

using mace::clebsch_gordan;
using mace::Irreps;
using mace::real_coupling;
using mace::spherical_harmonics;

TEST(Irreps, ParsesAndPrintsAsMaceWritesThem) {
  const Irreps a = Irreps::parse("128x0e+128x1o");
  EXPECT_EQ(a.to_string(), "128x0e+128x1o");
  EXPECT_EQ(a.dim(), 128 + 128 * 3);
  EXPECT_EQ(a.num_irreps(), 256);
  EXPECT_EQ(a.lmax(), 1);
  EXPECT_EQ(a.offsets(), (std::vector<int64_t>{0, 128, 512}));
  const Irreps b = Irreps::parse(" 0e + 2x1o+1x3o ");
  EXPECT_EQ(b.to_string(), "1x0e+2x1o+1x3o");
  EXPECT_EQ(b.dim(), 1 + 6 + 7);
  EXPECT_EQ(b.terms()[2].irrep.parity, -1);
  EXPECT_EQ(b.lmax(), 3);
  EXPECT_EQ(Irreps::parse("64x0e+64x1o+64x2e"), Irreps::parse("64x0e + 64x1o + 64x2e"));
  EXPECT_EQ(Irreps::parse("").dim(), 0);
}

TEST(Irreps, BadTermsNameTheTerm) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      (void)Irreps::parse(text);
      FAIL() << "expected ConfigError for '" << text << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("128x0e+", "term '' must be [<mul>x]<l><e|o>");
  expect_error("32x4e", "got l = 4");
  expect_error("0x0e", "got multiplicity '0'");
  expect_error("32x1q", "got parity 'q' (e or o)");
  expect_error("32xe", "got no <l><e|o>");
  expect_error("ax1o", "got multiplicity 'a'");
}

at::Tensor from_json(const nlohmann::json& rows) {
  std::vector<double> flat;
  for (const auto& r : rows) {
    for (const auto& v : r) flat.push_back(v.get<double>());
  }
  return at::tensor(flat, at::kDouble).reshape({static_cast<int64_t>(rows.size()), -1});
}

TEST(SphericalHarmonics, MatchScipyToL3) {
  if (!testing::python_has("scipy,numpy")) GTEST_SKIP() << "scipy unavailable at " << CRUCIBLE_PYTHON;
  const std::string out = testing::run_python(std::string(CRUCIBLE_SOURCE_DIR) +
                                              "/tests/models/oracles/spherical_harmonics_oracle.py 7 200 3");
  ASSERT_FALSE(out.empty()) << "spherical_harmonics_oracle.py failed";
  const auto j = nlohmann::json::parse(out);
  const at::Tensor v = from_json(j.at("vectors"));
  const at::Tensor want = from_json(j.at("values"));
  const at::Tensor got = spherical_harmonics(v, 3);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-12);
  // Lower lmax gives the leading columns.
  EXPECT_TRUE(spherical_harmonics(v, 1).equal(got.narrow(1, 0, 4)));
}

TEST(SphericalHarmonics, ComponentNormalisationParityAndRotations) {
  at::manual_seed(3);
  const at::Tensor v = at::randn({500, 3}, at::kDouble);
  const at::Tensor y = spherical_harmonics(v, 3);
  for (int l = 0; l <= 3; ++l) {
    const at::Tensor block = y.narrow(1, l * l, 2 * l + 1);
    EXPECT_LT((block.pow(2).sum(1) - (2 * l + 1)).abs().max().item<double>(), 1e-12) << l;
    // Parity: Y_l(-r) = (-1)^l Y_l(r).
    const at::Tensor flipped = spherical_harmonics(-v, 3).narrow(1, l * l, 2 * l + 1);
    EXPECT_LT((flipped - (l % 2 ? -1.0 : 1.0) * block).abs().max().item<double>(), 1e-12) << l;
  }
  // Rotations: Y_l(R r) = D_l(R) Y_l(r) with an orthogonal D_l, found by
  // least squares from the first 400 points and checked on the other 100.
  const at::Tensor q = std::get<0>(at::linalg_qr(at::randn({3, 3}, at::kDouble)));
  const at::Tensor r = q * at::linalg_det(q).sign();  // proper rotation
  const at::Tensor yr = spherical_harmonics(at::matmul(v, r.t()), 3);
  for (int l = 1; l <= 3; ++l) {
    const at::Tensor a = y.narrow(1, l * l, 2 * l + 1);
    const at::Tensor b = yr.narrow(1, l * l, 2 * l + 1);
    const at::Tensor dt = std::get<0>(at::linalg_lstsq(a.narrow(0, 0, 400), b.narrow(0, 0, 400)));
    const at::Tensor pred = at::matmul(a.narrow(0, 400, 100), dt);
    EXPECT_LT((pred - b.narrow(0, 400, 100)).abs().max().item<double>(), 1e-10) << l;
    EXPECT_LT((at::matmul(dt.t(), dt) - at::eye(2 * l + 1, at::kDouble)).abs().max().item<double>(), 1e-10) << l;
  }
}

TEST(SphericalHarmonics, ZeroVectorHasFiniteGradientAndErrorsNameTheInput) {
  at::Tensor v = at::zeros({2, 3}, at::kDouble);
  v[1] = at::tensor({0.3, -1.2, 0.5}, at::kDouble);
  v.requires_grad_(true);
  const at::Tensor y = spherical_harmonics(v, 3);
  EXPECT_EQ(y[0].narrow(0, 1, 15).abs().sum().item<double>(), 0.0);
  y.sum().backward();
  EXPECT_TRUE(v.grad().isfinite().all().item<bool>());
  EXPECT_THROW(spherical_harmonics(at::zeros({2, 2}), 1), std::invalid_argument);
  EXPECT_THROW(spherical_harmonics(at::zeros({2, 3}), 4), std::invalid_argument);
}

// The engine's fused harmonics (issue 48) against the reference form:
// values, and the hand-written gradient against autograd through the
// reference and against central finite differences (independent oracle).
at::Tensor random_vectors(at::ScalarType dt) {
  at::manual_seed(7);
  at::Tensor v = at::randn({300, 3}, at::kDouble) * 2.5;
  v[0] = at::zeros({3}, at::kDouble);                        // no direction
  v[1] = at::tensor({0.0, 0.0, -1.7}, at::kDouble);          // on an axis
  v[2] = at::tensor({1e-3, -2e-3, 5e-4}, at::kDouble);       // short
  return v.to(dt);
}

TEST(SphericalHarmonicsEngine, ValuesAndGradientEqualTheReferenceForm) {
  for (const at::ScalarType dt : {at::kDouble, at::kFloat}) {
    const double tol = dt == at::kDouble ? 1e-13 : 2e-6;
    for (const bool normalize : {true, false}) {
      for (int lmax = 0; lmax <= 3; ++lmax) {
        at::Tensor v = random_vectors(dt);
        if (!normalize) v = v / v.norm(2, 1, true).clamp_min(1e-30);  // unit rows, the zero row kept
        const at::Tensor a = v.clone().requires_grad_(true), b = v.clone().requires_grad_(true);
        const at::Tensor ya = mace::spherical_harmonics(a, lmax, normalize);
        const at::Tensor yb = mace::spherical_harmonics_engine(b, lmax, normalize);
        ASSERT_EQ(yb.sizes(), ya.sizes());
        ASSERT_EQ(yb.scalar_type(), dt);
        EXPECT_LT((ya - yb).abs().max().item<double>(), tol) << "values lmax " << lmax << " normalize " << normalize;
        const at::Tensor g = at::randn(ya.sizes(), at::kDouble).to(dt);
        const at::Tensor gb = torch::autograd::grad({yb}, {b}, {g})[0];
        if (lmax == 0) {  // Y_00 is a constant: the reference has no graph, the engine a zero gradient
          EXPECT_EQ(gb.abs().max().item<double>(), 0.0);
          continue;
        }
        const at::Tensor ga = torch::autograd::grad({ya}, {a}, {g})[0];
        const double scale = ga.abs().max().item<double>() + 1.0;
        EXPECT_LT((ga - gb).abs().max().item<double>(), tol * scale * (normalize ? 1e3 : 1.0))
            << "gradient lmax " << lmax << " normalize " << normalize;  // the 1e-3 Å row: 1/|v| = 400
        if (normalize) EXPECT_EQ(gb[0].abs().sum().item<double>(), 0.0);  // a zero row has no gradient
      }
    }
  }
}

TEST(SphericalHarmonicsEngine, GradientEqualsFiniteDifferences) {
  at::manual_seed(3);
  const at::Tensor v = at::randn({40, 3}, at::kDouble) * 2.0;
  const at::Tensor g = at::randn({40, 16}, at::kDouble);
  const at::Tensor a = v.clone().requires_grad_(true);
  const at::Tensor grad = torch::autograd::grad({mace::spherical_harmonics_engine(a, 3)}, {a}, {g})[0];
  const double h = 1e-6;
  for (int c = 0; c < 3; ++c) {
    at::Tensor plus = v.clone(), minus = v.clone();
    plus.select(1, c).add_(h);
    minus.select(1, c).sub_(h);
    // Each row's harmonics depend on that row only: one column of the
    // Jacobian-vector products for all rows at once.
    const at::Tensor fd = ((mace::spherical_harmonics_engine(plus, 3) - mace::spherical_harmonics_engine(minus, 3)) * g)
                              .sum(1) / (2 * h);
    EXPECT_LT((fd - grad.select(1, c)).abs().max().item<double>(), 1e-7) << "component " << c;
  }
}

TEST(SphericalHarmonicsEngine, RefusesASecondDerivativeAndBadInput) {
  const at::Tensor v = at::randn({5, 3}, at::kDouble).requires_grad_(true);
  const at::Tensor y = mace::spherical_harmonics_engine(v, 3);
  EXPECT_THROW(torch::autograd::grad({y.sum()}, {v}, {}, /*retain_graph=*/true, /*create_graph=*/true),
               std::runtime_error);
  EXPECT_THROW(mace::spherical_harmonics_engine(at::zeros({2, 2}), 1), std::invalid_argument);
  EXPECT_THROW(mace::spherical_harmonics_engine(at::zeros({2, 3}), 4), std::invalid_argument);
}

TEST(ClebschGordan, EveryCoefficientToL3MatchesSympy) {
  if (!testing::python_has("sympy")) GTEST_SKIP() << "sympy unavailable at " << CRUCIBLE_PYTHON;
  const std::string out = testing::run_python(std::string(CRUCIBLE_SOURCE_DIR) +
                                              "/tests/models/oracles/clebsch_gordan_oracle.py 3");
  ASSERT_FALSE(out.empty()) << "clebsch_gordan_oracle.py failed";
  const auto rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 449u);  // non-zero coefficients with every l <= 3
  // Every non-zero coefficient of sympy, and no other non-zero one here.
  int64_t ours_nonzero = 0;
  for (int l1 = 0; l1 <= 3; ++l1)
    for (int l2 = 0; l2 <= 3; ++l2)
      for (int l3 = 0; l3 <= 3; ++l3) ours_nonzero += (clebsch_gordan(l1, l2, l3).abs() > 1e-15).sum().item<int64_t>();
  EXPECT_EQ(ours_nonzero, static_cast<int64_t>(rows.size()));
  double worst = 0.0;
  for (const auto& r : rows) {
    const int l1 = r[0], m1 = r[1], l2 = r[2], m2 = r[3], l3 = r[4], m3 = r[5];
    const double got = clebsch_gordan(l1, l2, l3)[m1 + l1][m2 + l2][m3 + l3].item<double>();
    worst = std::max(worst, std::abs(got - r[6].get<double>()));
  }
  EXPECT_LT(worst, 1e-13);
  EXPECT_THROW(clebsch_gordan(9, 0, 9), std::invalid_argument);
}

// The real coupling commutes with rotations in the basis of
// spherical_harmonics(): C(D1 a, D2 b) = D3 C(a, b), with each D_l found
// from the harmonics of rotated points (so the change of basis U_l and the
// harmonics are checked against each other).
TEST(ClebschGordan, RealCouplingIsEquivariantInTheHarmonicsBasis) {
  at::manual_seed(5);
  const at::Tensor v = at::randn({400, 3}, at::kDouble);
  const at::Tensor q = std::get<0>(at::linalg_qr(at::randn({3, 3}, at::kDouble)));
  const at::Tensor r = q * at::linalg_det(q).sign();
  const at::Tensor y = spherical_harmonics(v, 3), yr = spherical_harmonics(at::matmul(v, r.t()), 3);
  std::vector<at::Tensor> d;  // D_l with Y_l(R r) = D_l Y_l(r)
  for (int l = 0; l <= 3; ++l) {
    const at::Tensor a = y.narrow(1, l * l, 2 * l + 1), b = yr.narrow(1, l * l, 2 * l + 1);
    d.push_back(std::get<0>(at::linalg_lstsq(a, b)).t());
  }
  int checked = 0;
  for (int l1 = 0; l1 <= 3; ++l1)
    for (int l2 = 0; l2 <= 3; ++l2)
      for (int l3 = std::abs(l1 - l2); l3 <= std::min(l1 + l2, 3); ++l3) {
        SCOPED_TRACE(std::to_string(l1) + "x" + std::to_string(l2) + "->" + std::to_string(l3));
        const at::Tensor c = real_coupling(l1, l2, l3);
        EXPECT_NEAR(c.pow(2).sum().item<double>(), 1.0, 1e-12);
        const at::Tensor a = at::randn({2 * l1 + 1}, at::kDouble), b = at::randn({2 * l2 + 1}, at::kDouble);
        auto couple = [&](const at::Tensor& x, const at::Tensor& w) {
          return at::einsum("ijk,i,j->k", {c, x, w});
        };
        const at::Tensor lhs = couple(at::matmul(d[l1], a), at::matmul(d[l2], b));
        const at::Tensor rhs = at::matmul(d[l3], couple(a, b));
        EXPECT_LT((lhs - rhs).abs().max().item<double>(), 1e-10);
        ++checked;
      }
  EXPECT_EQ(checked, 34);  // triples (l1, l2, l3) <= 3 that obey the triangle rule
  // 1 x 1 -> 0 is the dot product, 1 x 1 -> 1 the cross product (up to scale and sign).
  const at::Tensor x = at::tensor({0.3, -1.1, 0.7}, at::kDouble), w = at::tensor({1.2, 0.4, -0.5}, at::kDouble);
  const at::Tensor dot = at::einsum("ijk,i,j->k", {real_coupling(1, 1, 0), x, w});
  EXPECT_NEAR(std::abs(dot.item<double>()), std::abs(x.dot(w).item<double>()) / std::sqrt(3.0), 1e-12);
  const at::Tensor cross = at::einsum("ijk,i,j->k", {real_coupling(1, 1, 1), x, x});
  EXPECT_LT(cross.abs().max().item<double>(), 1e-14);  // antisymmetric: a × a = 0
  EXPECT_EQ(real_coupling(1, 1, 3).abs().sum().item<double>(), 0.0);  // triangle rule
}

}  // namespace
}  // namespace crucible
