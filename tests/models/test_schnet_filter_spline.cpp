// Issue 48: SchNet's filter network W_t(r) as quintic Hermite splines of the
// distance on the inference path (SchNetImpl::filter_spline). Oracles: an
// analytic function that is not even in r (the table's Origin::kSmooth
// node at r = 0); the filter network itself, evaluated layer by layer in
// float64 with autograd's derivative (not the forward-mode formulas the
// table is built from); and the same model's exact path
// (set_filter_spline(false)): energies to 1e-7 relative, forces and stress
// to 1e-6, float64.

#include "crucible/models/energy_model.h"
#include "crucible/models/mace/radial_spline.h"
#include "crucible/models/schnet.h"
#include "models/helpers.h"
#include "models/small_models.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cmath>
#include <cstdio>
#include <memory>

namespace crucible {
namespace {

using testing::biased_schnet;
using testing::max_abs_diff;
using testing::mixed_batch;

/// R(r) = exp(-2 (r - 0.3)²): R'(0) = 1.2 R(0) ≠ 0.
mace::RadialSpline::Values shifted_gaussian(const at::Tensor& r) {
  const at::Tensor d = r - 0.3, g = at::exp(-2.0 * d * d);
  return {g.unsqueeze(1), (-4.0 * d * g).unsqueeze(1), ((16.0 * d * d - 4.0) * g).unsqueeze(1)};
}

TEST(FilterSpline, SmoothOriginKeepsTheSlopeAtZeroWhereEvenWouldNot) {
  const mace::RadialSpline smooth(shifted_gaussian, 4.0, 256, at::kDouble, mace::RadialSpline::Origin::kSmooth);
  const mace::RadialSpline even(shifted_gaussian, 4.0, 256, at::kDouble, mace::RadialSpline::Origin::kEven);
  const at::Tensor r = at::linspace(0.0, 2.0 * smooth.spacing(), 41, at::kDouble);  // the first two intervals
  const auto want = shifted_gaussian(r);
  EXPECT_LT(max_abs_diff(smooth.values(r), want.value), 1e-12);
  EXPECT_LT(max_abs_diff(smooth.derivatives(r), want.first), 1e-9);
  // Origin::kEven forces R'(0) = 0: its slope at r = 0 is off by R'(0) = 1.01.
  EXPECT_GT(max_abs_diff(even.derivatives(r), want.first), 0.5);
  EXPECT_LE(smooth.value_error(), 1e-11);
  EXPECT_GT(even.derivative_error(), 100 * smooth.derivative_error());
}

/// Interaction t's filter W(r) [M,K] from the model's own layers in float64:
/// Dense(ssp(Dense(g(r)))) · f_c(r), as SchNet's training path writes it.
at::Tensor filter_by_layers(SchNetImpl& m, int64_t t, const at::Tensor& r) {
  const SchNetOptions& o = m.options();
  const double delta = o.cutoff / static_cast<double>(o.num_gaussians - 1), gamma = 0.5 / (delta * delta);
  const at::Tensor mu = m.named_buffers()["offsets"].to(at::kDouble);  // float32-rounded in a converted model
  const at::Tensor g = at::exp(-gamma * (r.unsqueeze(1) - mu).pow(2));
  auto f1 = m.named_modules()["filter1." + std::to_string(t)]->as<torch::nn::Linear>();
  auto f2 = m.named_modules()["filter2." + std::to_string(t)]->as<torch::nn::Linear>();
  // ssp(z) = ln(½eᶻ + ½) written out stably (at::softplus switches to the
  // identity above z = 20, a 2e-9 step).
  const at::Tensor z = f1->forward(g);
  const at::Tensor a = at::clamp_min(z, 0.0) + at::log1p(at::exp(-z.abs())) - std::log(2.0);
  const at::Tensor fc = 0.5 * (at::cos(r * (M_PI / o.cutoff)) + 1.0) * (r < o.cutoff).to(at::kDouble);
  return f2->forward(a) * fc.unsqueeze(1);
}

TEST(FilterSpline, TableEqualsTheFilterNetworkAndItsAutogradSlope) {
  auto model = std::dynamic_pointer_cast<SchNetImpl>(biased_schnet());  // float64, 3 interactions, 12 filters
  at::manual_seed(5);
  const at::Tensor r = at::rand({2000}, at::kDouble) * model->options().cutoff;
  for (int64_t t = 0; t < model->options().num_interactions; ++t) {
    const auto s = model->filter_spline(t);
    ASSERT_TRUE(s != nullptr);
    EXPECT_EQ(s->num_outputs(), model->options().num_filters);
    EXPECT_EQ(s->dtype(), at::kDouble);
    std::printf("    [info] SchNet interaction %lld: %lld intervals, error %.1e (values) %.1e (derivatives)\n",
                static_cast<long long>(t), static_cast<long long>(s->num_intervals()), s->value_error(),
                s->derivative_error());
    const at::Tensor rr = r.clone().requires_grad_(true);
    at::Tensor W;
    {
      at::AutoGradMode grad(true);
      W = filter_by_layers(*model, t, rr);
    }
    const double wmax = W.abs().max().item<double>();
    EXPECT_LT(max_abs_diff(s->values(r), W.detach()), 1e-9 * wmax) << t;
    // Σ_k c_k W_k'(r) by autograd against the table's backward, random c.
    const at::Tensor c = at::randn({2000, W.size(1)}, at::kDouble);
    const at::Tensor slope = torch::autograd::grad({(W * c).sum()}, {rr})[0];
    EXPECT_LT(max_abs_diff(s->backward(r, c), slope), 1e-7 * slope.abs().max().item<double>()) << t;
    EXPECT_LE(s->value_error(), 1e-9);
    EXPECT_LE(s->derivative_error(), 1e-7);
  }
}

TEST(FilterSpline, SchNetEqualsItsExactFilterNetwork) {
  auto model = biased_schnet();
  auto& schnet = dynamic_cast<SchNetImpl&>(*model);
  const Batch batch = mixed_batch(model->cutoff());
  ComputeOptions co;
  co.stress = true;
  co.energies = true;
  schnet.set_filter_spline(false);
  EXPECT_EQ(schnet.filter_spline(0), nullptr);
  const ModelOutputs exact = compute_outputs(*model, batch, co);
  schnet.set_filter_spline(true);
  const ModelOutputs spline = compute_outputs(*model, batch, co);
  ASSERT_GT(exact.forces.abs().max().item<double>(), 1e-3);
  const double e_rel = max_abs_diff(spline.energy, exact.energy) / exact.energy.abs().max().item<double>();
  const double f_rel = max_abs_diff(spline.forces, exact.forces) / exact.forces.abs().max().item<double>();
  const double s_rel = max_abs_diff(spline.stress, exact.stress) / exact.stress.abs().max().item<double>();
  std::printf("    [info] SchNet splines against the exact network: energy %.1e, forces %.1e, stress %.1e relative\n",
              e_rel, f_rel, s_rel);
  EXPECT_LT(e_rel, 1e-7);
  EXPECT_LT(f_rel, 1e-6);
  EXPECT_LT(s_rel, 1e-6);
  EXPECT_LT(max_abs_diff(spline.energies, exact.energies), 1e-7 * exact.energies.abs().max().item<double>());
  // Two different evaluations (the spline is not the network itself).
  EXPECT_GT(max_abs_diff(spline.forces, exact.forces), 0.0);
}

TEST(FilterSpline, Float32ModelAgreesWithItsFloat64Evaluation) {
  auto m64 = biased_schnet();
  auto m32 = m64->clone_model();
  m32->module().to(at::kFloat);
  const Batch b64 = mixed_batch(m64->cutoff());
  const Batch b32 = b64.to(at::kCPU, at::kFloat);
  ComputeOptions co;
  const ModelOutputs want = compute_outputs(*m64, b64, co);
  const ModelOutputs got = compute_outputs(*m32, b32, co);
  EXPECT_EQ(dynamic_cast<SchNetImpl&>(*m32).filter_spline(0)->dtype(), at::kFloat);
  EXPECT_LT(max_abs_diff(got.forces.to(at::kDouble), want.forces), 1e-4 * want.forces.abs().max().item<double>());
}

TEST(FilterSpline, TableFollowsTheWeightsAndIsKeptOtherwise) {
  auto model = std::dynamic_pointer_cast<SchNetImpl>(biased_schnet());
  const auto first = model->filter_spline(1);
  EXPECT_EQ(model->filter_spline(1).get(), first.get());  // no rebuild without a change
  const at::Tensor r = at::linspace(0.2, 3.0, 50, at::kDouble);
  const at::Tensor before = first->values(r);
  {
    at::NoGradGuard no_grad;
    model->named_parameters()["filter2.1.bias"].add_(0.5);  // in place: the version changes
  }
  const auto second = model->filter_spline(1);
  EXPECT_NE(second.get(), first.get());
  at::Tensor want;
  {
    at::NoGradGuard no_grad;
    want = filter_by_layers(*model, 1, r);
  }
  EXPECT_LT(max_abs_diff(second->values(r), want), 1e-9 * want.abs().max().item<double>());
  EXPECT_GT(max_abs_diff(second->values(r), before), 0.1);
  EXPECT_THROW(model->filter_spline(3), std::out_of_range);
}

TEST(FilterSpline, CloneKeepsItsOwnTables) {
  auto model = std::dynamic_pointer_cast<SchNetImpl>(biased_schnet());
  const auto original = model->filter_spline(0);
  auto copy = std::dynamic_pointer_cast<SchNetImpl>(model->clone_model());
  ASSERT_TRUE(copy);
  const auto copied = copy->filter_spline(0);
  EXPECT_NE(copied.get(), original.get());  // built from the clone's own weights
  {
    at::NoGradGuard no_grad;
    copy->named_parameters()["filter2.0.bias"].add_(0.5);
  }
  EXPECT_NE(copy->filter_spline(0).get(), copied.get());
  EXPECT_EQ(model->filter_spline(0).get(), original.get());  // the original's table is untouched
}

}  // namespace
}  // namespace crucible
