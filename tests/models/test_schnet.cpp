// SchNet: invariances, batching, module plumbing (buffers, clone, dtype).

#include "crucible/models/energy_model.h"
#include "crucible/models/schnet.h"
#include "models/helpers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace crucible {
namespace {

using testing::make_batch;
using testing::make_structure;
using testing::molecule;
using testing::random_periodic;
using testing::rel_err;

constexpr double kSchNetCutoff = 3.5;

SchNetOptions schnet_small_options() {
  SchNetOptions o;
  o.hidden_channels = 16;
  o.num_filters = 12;
  o.num_interactions = 3;
  o.num_gaussians = 10;
  o.cutoff = kSchNetCutoff;
  o.max_atomic_number = 20;
  return o;
}

SchNet double_model(uint64_t seed = 1) {
  at::manual_seed(seed);
  SchNet model(schnet_small_options());
  model->to(at::kDouble);
  return model;
}

/// Rotation matrix (proper, det +1) from axis-angle.
at::Tensor rotation(double ax, double ay, double az, double angle) {
  const double n = std::sqrt(ax * ax + ay * ay + az * az);
  ax /= n;
  ay /= n;
  az /= n;
  const double c = std::cos(angle), s = std::sin(angle), t = 1 - c;
  return at::tensor(std::vector<double>{t * ax * ax + c, t * ax * ay - s * az, t * ax * az + s * ay,
                                        t * ax * ay + s * az, t * ay * ay + c, t * ay * az - s * ax,
                                        t * ax * az - s * ay, t * ay * az + s * ax, t * az * az + c},
                    at::kDouble)
      .view({3, 3});
}

TEST(SchNet, DefaultOptionsAndParameterCount) {
  SchNetOptions d;
  EXPECT_EQ(d.hidden_channels, 64);
  EXPECT_EQ(d.num_filters, 64);
  EXPECT_EQ(d.num_interactions, 3);
  EXPECT_EQ(d.num_gaussians, 20);
  EXPECT_DOUBLE_EQ(d.cutoff, 5.0);
  EXPECT_EQ(d.max_atomic_number, 118);
  SchNet model(schnet_small_options());
  const int64_t F = 16, K = 12, G = 10, T = 3, Z = 21;
  const int64_t per_block = (G * K + K) + (K * K + K) + F * K + (K * F + F) + (F * F + F);
  const int64_t expected = Z * F + T * per_block + (F * (F / 2) + F / 2) + (F / 2 + 1);
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  EXPECT_EQ(count, expected);
  auto buffers = model->named_buffers();
  ASSERT_TRUE(buffers.contains("offsets"));
  ASSERT_TRUE(buffers.contains("e0"));
  ASSERT_TRUE(buffers.contains("scale"));
  ASSERT_TRUE(buffers.contains("shift"));
  EXPECT_EQ(buffers["e0"].sizes(), (at::IntArrayRef{Z}));
  EXPECT_EQ(buffers["scale"].dim(), 0);
  EXPECT_EQ(buffers["shift"].dim(), 0);
  EXPECT_NEAR(buffers["offsets"][G - 1].item<double>(), kSchNetCutoff, 1e-6);
  EXPECT_EQ(buffers["offsets"][0].item<double>(), 0.0);
  EXPECT_EQ(model->name(), "schnet");
  EXPECT_DOUBLE_EQ(model->cutoff(), kSchNetCutoff);
}

TEST(SchNet, InvalidOptionsThrow) {
  SchNetOptions o = schnet_small_options();
  o.num_gaussians = 1;
  EXPECT_THROW(SchNet{o}, std::invalid_argument);
  o = schnet_small_options();
  o.cutoff = -1;
  EXPECT_THROW(SchNet{o}, std::invalid_argument);
  o = schnet_small_options();
  o.hidden_channels = 1;
  EXPECT_THROW(SchNet{o}, std::invalid_argument);
  SchNet model(schnet_small_options());
  EXPECT_THROW(model->set_energy_normalization(at::zeros({5}, at::kDouble), 1, 0), std::invalid_argument);
}

TEST(SchNet, ToDoubleConvertsParametersAndBuffers) {
  SchNet model(schnet_small_options());
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  model->to(at::kDouble);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kDouble);
  for (const auto& b : model->buffers()) EXPECT_EQ(b.scalar_type(), at::kDouble);
  Batch b = make_batch({molecule()}, kSchNetCutoff);
  EXPECT_EQ(model->energy(b).scalar_type(), at::kDouble);
}

TEST(SchNet, BatchingInvariance) {
  SchNet model = double_model();
  std::vector<Structure> structures{random_periodic(6, {13, 8, 1}, 1), molecule(),
                                    random_periodic(3, {20}, 2)};
  at::NoGradGuard no_grad;
  at::Tensor batched = model->energy(make_batch(structures, kSchNetCutoff));
  ASSERT_EQ(batched.sizes(), (at::IntArrayRef{3}));
  for (int64_t k = 0; k < 3; ++k) {
    at::Tensor alone = model->energy(make_batch({structures[k]}, kSchNetCutoff));
    EXPECT_NEAR(batched[k].item<double>(), alone[0].item<double>(), 1e-12) << "structure " << k;
  }
  // Forces too.
  ModelOutputs all = compute_outputs(*model, make_batch(structures, kSchNetCutoff), {});
  ModelOutputs first = compute_outputs(*model, make_batch({structures[0]}, kSchNetCutoff), {});
  EXPECT_LT((all.forces.narrow(0, 0, 6) - first.forces).abs().max().item<double>(), 1e-12);
}

TEST(SchNet, TranslationInvariance) {
  SchNet model = double_model();
  at::NoGradGuard no_grad;
  for (const Structure& s : {random_periodic(6, {13, 8}, 3), molecule()}) {
    Batch b = make_batch({s}, kSchNetCutoff);
    const double e = model->energy(b).item<double>();
    b.positions = b.positions + at::tensor(std::vector<double>{1.3, -7.2, 0.4}, at::kDouble);
    EXPECT_NEAR(model->energy(b).item<double>(), e, 1e-11 * std::max(1.0, std::abs(e)));
  }
}

TEST(SchNet, RotationInvarianceOfEnergyAndEquivarianceOfForces) {
  SchNet model = double_model();
  const at::Tensor R = rotation(0.3, -1.0, 0.5, 1.1);
  for (const Structure& s : {random_periodic(6, {13, 8}, 4), molecule()}) {
    Batch b = make_batch({s}, kSchNetCutoff);
    ComputeOptions opt;
    opt.stress = true;
    ModelOutputs ref = compute_outputs(*model, b, opt);
    // Row vectors: r' = r Rᵀ, cell' = cell Rᵀ (shifts unchanged).
    Batch rb = b;
    rb.positions = at::matmul(b.positions, R.t());
    rb.cell = at::matmul(b.cell, R.t());
    ModelOutputs rot = compute_outputs(*model, rb, opt);
    EXPECT_NEAR(rot.energy.item<double>(), ref.energy.item<double>(), 1e-11);
    EXPECT_LT(rel_err(rot.forces, at::matmul(ref.forces, R.t())), 1e-10);
    // σ' = R σ Rᵀ.
    if (s.periodic()) {
      EXPECT_LT(rel_err(rot.stress[0], at::matmul(R, at::matmul(ref.stress[0], R.t()))), 1e-10);
    }
  }
}

TEST(SchNet, PermutationInvariance) {
  SchNet model = double_model();
  Structure s = molecule();
  Batch b = make_batch({s}, kSchNetCutoff);
  ModelOutputs ref = compute_outputs(*model, b, {});
  const at::Tensor perm = at::tensor(std::vector<int64_t>{4, 2, 8, 0, 1, 7, 3, 6, 5}, at::kLong);
  Structure p = s;
  p.positions = s.positions.index_select(0, perm);
  p.atomic_numbers = s.atomic_numbers.index_select(0, perm);
  ModelOutputs out = compute_outputs(*model, make_batch({p}, kSchNetCutoff), {});
  EXPECT_NEAR(out.energy.item<double>(), ref.energy.item<double>(), 1e-12);
  EXPECT_LT((out.forces - ref.forces.index_select(0, perm)).abs().max().item<double>(), 1e-12);
}

TEST(SchNet, EdgesBeyondCutoffContributeNothing) {
  SchNet model = double_model();
  at::NoGradGuard no_grad;
  for (const Structure& s : {random_periodic(5, {13, 8}, 5), molecule()}) {
    Batch tight = make_batch({s}, kSchNetCutoff);
    Batch wide = make_batch({s}, kSchNetCutoff + 2.0);
    ASSERT_GT(wide.num_edges(), tight.num_edges());
    EXPECT_NEAR(model->energy(wide).item<double>(), model->energy(tight).item<double>(), 1e-12);
  }
}

TEST(SchNet, EnergyIsSmoothAcrossTheCutoff) {
  SchNet model = double_model();
  at::NoGradGuard no_grad;
  auto dimer = [&](double d) {
    Structure s = make_structure({0, 0, 0, d, 0, 0}, {8, 13}, std::vector<double>(9, 0.0),
                                 {false, false, false});
    return model->energy(make_batch({s}, kSchNetCutoff + 1.0)).item<double>();
  };
  const double far = dimer(kSchNetCutoff + 0.5);
  EXPECT_NEAR(dimer(kSchNetCutoff + 1e-9), far, 1e-12);
  EXPECT_NEAR(dimer(kSchNetCutoff - 1e-4), far, 1e-8);  // f_c ~ (π δ / 2 r_c)² → 0
  EXPECT_GT(std::abs(dimer(kSchNetCutoff - 1.0) - far), 1e-8);
}

TEST(SchNet, EnergyNormalizationBuffers) {
  SchNet model = double_model();
  Structure s = molecule();
  Batch b = make_batch({s}, kSchNetCutoff);
  at::NoGradGuard no_grad;
  const at::Tensor y = model->atomic_energies(b);  // scale 1, shift 0 → raw y
  EXPECT_NEAR(model->energy(b).item<double>(), y.sum().item<double>(), 1e-12);
  at::Tensor e0 = at::zeros({21}, at::kDouble);
  e0[1] = -13.6;
  e0[6] = -1030.0;
  e0[8] = -2040.0;
  model->set_energy_normalization(e0, 2.5, -0.25);
  const double expected = 2.5 * y.sum().item<double>() - 0.25 * 9 + 2 * -1030.0 + -2040.0 + 6 * -13.6;
  EXPECT_NEAR(model->energy(b).item<double>(), expected, 1e-9);
  EXPECT_LT((model->atomic_energies(b) - (2.5 * y - 0.25)).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(model->named_buffers()["e0"].scalar_type(), at::kDouble);
  // Buffers are not parameters.
  for (const auto& p : model->named_parameters()) EXPECT_EQ(p.key().find("e0"), std::string::npos);
}

TEST(SchNet, CloneIsDeepAndEqual) {
  SchNet model = double_model();
  at::Tensor e0 = at::full({21}, -1.0, at::kDouble);
  model->set_energy_normalization(e0, 1.5, 0.1);
  auto copy = std::dynamic_pointer_cast<SchNetImpl>(model->clone());
  ASSERT_TRUE(copy);
  Batch b = make_batch({random_periodic(5, {13, 8}, 6)}, kSchNetCutoff);
  at::NoGradGuard no_grad;
  EXPECT_EQ(copy->energy(b).item<double>(), model->energy(b).item<double>());
  // Independent storage.
  for (auto& p : copy->parameters()) p.add_(0.01);
  EXPECT_NE(copy->energy(b).item<double>(), model->energy(b).item<double>());
  EXPECT_EQ(copy->named_buffers()["e0"][1].item<double>(), -1.0);
}

TEST(SchNet, Float32Model) {
  at::manual_seed(3);
  SchNet model(schnet_small_options());
  Batch b = make_batch({random_periodic(5, {13, 8}, 7), molecule()}, kSchNetCutoff);
  Batch b32 = b;
  for (at::Tensor* t : {&b32.positions, &b32.shifts, &b32.cell}) *t = t->to(at::kFloat);
  ComputeOptions opt;
  opt.stress = true;
  ModelOutputs out = compute_outputs(*model, b32, opt);
  EXPECT_EQ(out.energy.scalar_type(), at::kDouble);  // energies are summed in float64 (issue 48)
  EXPECT_EQ(out.forces.scalar_type(), at::kFloat);
  EXPECT_TRUE(out.forces.isfinite().all().item<bool>());
  EXPECT_TRUE(out.stress.isfinite().all().item<bool>());
}

}  // namespace
}  // namespace crucible
