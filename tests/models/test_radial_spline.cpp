// Issue 48, step 1 of docs/mace_engine.md: MACE's radial weights as cubic
// Hermite splines of the distance. Oracles: an analytic function with the
// Hermite remainder's bounds (h⁶/46080 · max|R⁽⁶⁾| for values, a loose h⁵
// one for derivatives), and the exact MLP path of the same model
// (energies to 1e-7 relative, forces and stress to 1e-6, float64), which
// set_radial_spline(false) selects.

#include "crucible/models/energy_model.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/mace/radial_spline.h"
#include "models/helpers.h"
#include "models/small_models.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>

namespace crucible {
namespace {

using testing::max_abs_diff;
using testing::mixed_batch;

/// R_k(r) = cos(ω_k r), ω_k = 1, 2, 3 (Å⁻¹), and dR/dr: even in r, as
/// MACE's radial functions (the spline takes R'(0) = 0).
mace::RadialSpline::Values cosines(const at::Tensor& r) {
  std::vector<at::Tensor> v, d, d2;
  for (double w : {1.0, 2.0, 3.0}) {
    v.push_back(at::cos(w * r));
    d.push_back(-w * at::sin(w * r));
    d2.push_back(-w * w * at::cos(w * r));
  }
  return {at::stack(v, 1), at::stack(d, 1), at::stack(d2, 1)};
}

TEST(RadialSpline, AnalyticFunctionWithinTheTextbookBoundsAtTenThousandDistances) {
  for (int64_t G : {8, 32, 128}) {
    const mace::RadialSpline s(cosines, 5.0, G, at::kDouble);
    const double h = s.spacing();
    EXPECT_DOUBLE_EQ(h, 5.0 / static_cast<double>(G));
    // |d⁶/dr⁶ cos(ωr)| ≤ ω⁶, largest for ω = 3. Values: the Hermite
    // remainder R⁽⁶⁾(ξ)/6! · (r − a)³(r − b)³ ≤ h⁶/46080 · max|R⁽⁶⁾|.
    // Derivatives: max|d/dr (r − a)³(r − b)³| = 0.0537 h⁵, and the
    // remainder's ξ-dependence at most doubles it (a loose bound).
    const double m6 = 729.0;
    const double value_bound = std::pow(h, 6) / 46080.0 * m6, deriv_bound = 2 * 0.0537 * std::pow(h, 5) / 720.0 * m6 * 2;
    at::manual_seed(1);
    const at::Tensor r = at::rand({10000}, at::kDouble) * 5.0;
    const auto want = cosines(r);
    EXPECT_LE(max_abs_diff(s.values(r), want.value), value_bound + 1e-15) << G;
    EXPECT_LE(max_abs_diff(s.derivatives(r), want.first), deriv_bound + 1e-14) << G;
    // The backward with g = e_k gives S'_k.
    for (int64_t k = 0; k < 3; ++k) {
      at::Tensor g = at::zeros({10000, 3}, at::kDouble);
      g.select(1, k).fill_(1.0);
      EXPECT_LE(max_abs_diff(s.backward(r, g), want.first.select(1, k)), deriv_bound + 1e-14) << G << " output " << k;
    }
    // The measured errors are errors, not zero, and below the bounds (max |R| = 1).
    EXPECT_GT(s.value_error(), 0.0);
    EXPECT_LE(s.value_error(), value_bound);
    EXPECT_LE(s.derivative_error(), deriv_bound / 2.9);  // max |R'| ≥ 2.9 on [0, 5]
  }
}

TEST(RadialSpline, BackwardIsTheDerivativeOfValuesForAnyWeights) {
  const mace::RadialSpline s(cosines, 5.0, 16, at::kDouble);
  at::manual_seed(2);
  const at::Tensor r = at::rand({257}, at::kDouble) * 4.9 + 0.05;
  const at::Tensor g = at::randn({257, 3}, at::kDouble);
  const double eps = 1e-6;
  const at::Tensor fd = ((s.values(r + eps) - s.values(r - eps)) * g).sum(1) / (2 * eps);
  EXPECT_LT(max_abs_diff(s.backward(r, g), fd), 1e-8);
}

TEST(RadialSpline, TabulateChoosesAGridThatMeetsTheTolerance) {
  const mace::RadialSpline s = mace::tabulate_radial(cosines, 5.0, 1e-9, at::kFloat);
  EXPECT_LE(s.value_error(), 1e-9);
  EXPECT_LE(s.derivative_error(), 1e-7);
  EXPECT_EQ(s.dtype(), at::kFloat);
  EXPECT_EQ(s.bytes(), s.num_intervals() * 6 * 3 * 4);
  // The coarser grid (half the intervals) would not have met it.
  const mace::RadialSpline coarser(cosines, 5.0, s.num_intervals() / 2, at::kDouble);
  EXPECT_TRUE(coarser.value_error() > 1e-9 || coarser.derivative_error() > 1e-7);
}

/// MACE with splines against the same model's exact radial MLP, inference
/// path both, on the mixed batch (two periodic cells and a molecule).
void expect_spline_equals_exact(const std::shared_ptr<EnergyModel>& model, const char* what) {
  auto& mace = dynamic_cast<MaceImpl&>(*model);
  const Batch batch = mixed_batch(model->cutoff());
  ComputeOptions co;
  co.stress = true;
  co.energies = true;
  mace.set_radial_spline(false);
  const ModelOutputs exact = compute_outputs(*model, batch, co);
  mace.set_radial_spline(true);
  const ModelOutputs spline = compute_outputs(*model, batch, co);
  ASSERT_TRUE(mace.radial_spline(0) != nullptr);
  for (int64_t t = 0; t < mace.options().num_interactions; ++t) {
    const auto sp = mace.radial_spline(t);
    std::printf("    [info] %s layer %lld: %lld intervals, %lld outputs, error %.1e (values) %.1e (derivatives)\n", what,
                static_cast<long long>(t), static_cast<long long>(sp->num_intervals()),
                static_cast<long long>(sp->num_outputs()), sp->value_error(), sp->derivative_error());
  }
  ASSERT_GT(exact.forces.abs().max().item<double>(), 1e-3) << what;
  const double e_rel = max_abs_diff(spline.energy, exact.energy) / exact.energy.abs().max().item<double>();
  const double f_rel = max_abs_diff(spline.forces, exact.forces) / exact.forces.abs().max().item<double>();
  const double s_rel = max_abs_diff(spline.stress, exact.stress) / exact.stress.abs().max().item<double>();
  EXPECT_LT(e_rel, 1e-7) << what;
  EXPECT_LT(f_rel, 1e-6) << what;
  EXPECT_LT(s_rel, 1e-6) << what;
  EXPECT_LT(max_abs_diff(spline.energies, exact.energies), 1e-7 * exact.energies.abs().max().item<double>()) << what;
  // The spline is not the MLP itself (a test of two identical paths would pass anyway).
  EXPECT_GT(max_abs_diff(spline.forces, exact.forces), 0.0) << what;
}

TEST(RadialSpline, MaceEqualsTheExactRadialMlpAcrossArchitectures) {
  struct Case {
    const char* irreps;
    int64_t max_ell, correlation, interactions;
    std::vector<int64_t> mlp;
  };
  const std::vector<Case> cases = {{"4x0e", 1, 1, 1, {8}},
                                   {"4x0e+4x1o", 2, 2, 2, {8, 8}},
                                   {"3x0e+3x1o+3x2e", 3, 3, 3, {16, 16, 16}},
                                   {"8x0e+8x1o", 3, 3, 2, {64, 64, 64}}};
  int seed = 30;
  for (const Case& c : cases) {
    MaceOptions o;
    o.hidden_irreps = c.irreps;
    o.max_ell = c.max_ell;
    o.correlation = c.correlation;
    o.num_interactions = c.interactions;
    o.radial_mlp = c.mlp;
    o.cutoff = 3.5;
    o.avg_num_neighbors = 8.0;
    o.atomic_numbers = {1, 6, 8, 13, 22, 29};
    at::manual_seed(seed++);
    auto m = std::make_shared<MaceImpl>(o);
    m->to(at::kDouble);
    m->set_energy_normalization(at::zeros({119}, at::kDouble).index_fill_(0, at::tensor({int64_t{29}}), -3.7), 1.3, 0.2);
    expect_spline_equals_exact(m, c.irreps);
  }
}

TEST(RadialSpline, TheTableFollowsTheWeightsAfterAnInPlaceChange) {
  auto model = testing::multi_element_mace();
  auto& mace = dynamic_cast<MaceImpl&>(*model);
  const auto before = mace.radial_spline(1);
  {
    at::NoGradGuard no_grad;
    for (auto& p : mace.named_parameters())
      if (p.key().find("radial") != std::string::npos) p.value().mul_(1.5);
  }
  const auto after = mace.radial_spline(1);
  ASSERT_NE(before.get(), after.get());
  at::manual_seed(4);
  const at::Tensor r = at::rand({100}, at::kDouble) * 3.4 + 0.05;
  EXPECT_GT(max_abs_diff(before->values(r), after->values(r)), 1e-3);
  EXPECT_EQ(mace.radial_spline(1).get(), after.get());  // unchanged weights: the same table
  expect_spline_equals_exact(model, "after the change");
  // A clone has its own table (built from its own weights).
  auto clone = std::dynamic_pointer_cast<MaceImpl>(mace.clone_model());
  EXPECT_NE(clone->radial_spline(1).get(), mace.radial_spline(1).get());
}

}  // namespace
}  // namespace crucible
