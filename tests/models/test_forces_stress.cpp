// Autograd forces and stress (compute_outputs) against central finite
// differences of the energy, in float64, with a randomly initialised SchNet.

#include "crucible/losses/loss.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/schnet.h"
#include "models/helpers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace crucible {
namespace {

using testing::make_batch;
using testing::make_structure;
using testing::molecule;
using testing::random_periodic;
using testing::rel_err;

constexpr double kStressCutoff = 3.5;
constexpr double kStep = 1e-5;
constexpr double kTol = 1e-6;

SchNet small_model(uint64_t seed = 7) {
  at::manual_seed(seed);
  SchNetOptions o;
  o.hidden_channels = 16;
  o.num_filters = 12;
  o.num_interactions = 2;
  o.num_gaussians = 10;
  o.cutoff = kStressCutoff;
  o.max_atomic_number = 20;
  SchNet model(o);
  model->to(at::kDouble);
  at::Tensor e0 = at::zeros({21}, at::kDouble);
  e0[1] = -0.5;
  e0[6] = -1.5;
  e0[8] = -2.0;
  e0[13] = -3.0;
  model->set_energy_normalization(e0, 1.7, 0.3);
  return model;
}

/// Slab: periodic along a and b only, with vacuum along c.
Structure slab() {
  Structure s = random_periodic(5, {13, 8}, 11);
  s.pbc = {true, true, false};
  // Stretch c so that periodic images along c would be out of range anyway.
  s.cell[2] = at::tensor(std::vector<double>{0.3, -0.2, 12.0}, at::kDouble);
  return s;
}

/// Prints an achieved error (visible in the test log).
void report(const std::string& what, double value) {
  std::printf("    [info] %s = %.3e\n", what.c_str(), value);
}

double total_energy(SchNet& model, const Batch& b) {
  at::NoGradGuard no_grad;
  return model->energy(b).sum().item<double>();
}

/// Central finite-difference forces -dE/dr, [N,3].
at::Tensor fd_forces(SchNet& model, const Batch& batch) {
  at::Tensor f = at::zeros_like(batch.positions);
  for (int64_t a = 0; a < batch.num_nodes(); ++a) {
    for (int64_t x = 0; x < 3; ++x) {
      Batch b = batch;
      b.positions = batch.positions.clone();
      b.positions[a][x] += kStep;
      const double ep = total_energy(model, b);
      b.positions[a][x] -= 2 * kStep;
      const double em = total_energy(model, b);
      f[a][x] = -(ep - em) / (2 * kStep);
    }
  }
  return f;
}

/// Batch with positions and cell of graph g deformed by (1 + eps), same edges/shifts.
Batch strained(const Batch& batch, int64_t g, const at::Tensor& eps) {
  Batch b = batch;
  const at::Tensor m = at::eye(3, at::kDouble) + eps;
  b.positions = batch.positions.clone();
  b.cell = batch.cell.clone();
  const at::Tensor sel = batch.batch.eq(g).nonzero().squeeze(1);
  b.positions.index_copy_(0, sel, at::matmul(batch.positions.index_select(0, sel), m));
  b.cell[g] = at::matmul(batch.cell[g], m);
  return b;
}

/// Central finite-difference stress (1/V) dE/dε under symmetric strain, [B,3,3]
/// (as ASE's Calculator.calculate_numerical_stress).
at::Tensor fd_stress(SchNet& model, const Batch& batch) {
  const int64_t B = batch.num_graphs();
  at::Tensor s = at::zeros({B, 3, 3}, at::kDouble);
  for (int64_t g = 0; g < B; ++g) {
    const double vol = std::abs(at::linalg_det(batch.cell[g]).item<double>());
    for (int64_t x = 0; x < 3; ++x) {
      for (int64_t y = 0; y < 3; ++y) {
        at::Tensor eps = at::zeros({3, 3}, at::kDouble);
        eps[x][y] += 0.5 * kStep;
        eps[y][x] += 0.5 * kStep;
        const double ep = total_energy(model, strained(batch, g, eps));
        const double em = total_energy(model, strained(batch, g, -eps));
        s[g][x][y] = (ep - em) / (2 * kStep * vol);
      }
    }
  }
  return s;
}

TEST(ForcesStress, EdgeVectorsMatchDefinition) {
  // Two structures (the per-edge cell gather) and one alone (one S · cell
  // product: the single-structure branch).
  Structure s = random_periodic(4, {13, 20}, 3);
  for (const Batch& b : {make_batch({s, molecule()}, kStressCutoff), make_batch({s}, kStressCutoff)}) {
    at::Tensor v = edge_vectors(b);
    ASSERT_EQ(v.sizes(), (at::IntArrayRef{b.num_edges(), 3}));
    ASSERT_GT(b.shifts.abs().sum().item<double>(), 0.0);  // some edges cross the cell
    for (int64_t e = 0; e < b.num_edges(); e += 7) {
      const int64_t i = b.edge_index[0][e].item<int64_t>();
      const int64_t j = b.edge_index[1][e].item<int64_t>();
      const int64_t g = b.batch[i].item<int64_t>();
      at::Tensor expect = b.positions[j] - b.positions[i] + at::matmul(b.shifts[e], b.cell[g]);
      EXPECT_LT((v[e] - expect).abs().max().item<double>(), 1e-14);
      EXPECT_LT(v[e].norm().item<double>(), kStressCutoff);
    }
  }
}

TEST(ForcesStress, ForcesMatchFiniteDifferencesPeriodicTriclinic) {
  SchNet model = small_model();
  Batch b = make_batch({random_periodic(6, {13, 8, 1}, 1)}, kStressCutoff);
  ASSERT_GT(b.num_edges(), 20);
  ModelOutputs out = compute_outputs(*model, b, {});
  at::Tensor fd = fd_forces(model, b);
  EXPECT_GT(fd.norm().item<double>(), 1e-3);
  report("periodic forces vs FD, relative error", rel_err(out.forces, fd));
  EXPECT_LT(rel_err(out.forces, fd), kTol) << out.forces << fd;
  EXPECT_NEAR(out.energy.sum().item<double>(), total_energy(model, b), 1e-12);
}

TEST(ForcesStress, ForcesMatchFiniteDifferencesMolecule) {
  SchNet model = small_model();
  Batch b = make_batch({molecule()}, kStressCutoff);
  ModelOutputs out = compute_outputs(*model, b, {});
  at::Tensor fd = fd_forces(model, b);
  report("molecule forces vs FD, relative error", rel_err(out.forces, fd));
  EXPECT_LT(rel_err(out.forces, fd), kTol);
  // Newton's third law: no net force on an isolated molecule.
  EXPECT_LT(out.forces.sum(0).abs().max().item<double>(), 1e-12);
}

TEST(ForcesStress, StressMatchesFiniteDifferencesTriclinic) {
  SchNet model = small_model();
  Batch b = make_batch({random_periodic(6, {13, 8, 1}, 2)}, kStressCutoff);
  ComputeOptions opt;
  opt.stress = true;
  ModelOutputs out = compute_outputs(*model, b, opt);
  at::Tensor fd = fd_stress(model, b);
  EXPECT_GT(fd.norm().item<double>(), 1e-4);
  report("triclinic stress vs FD, relative error", rel_err(out.stress, fd));
  EXPECT_LT(rel_err(out.stress, fd), kTol) << out.stress << fd;
  // Symmetric by construction.
  EXPECT_LT((out.stress - out.stress.transpose(1, 2)).abs().max().item<double>(), 1e-15);
  // Forces unaffected by the strain leaf.
  EXPECT_LT(rel_err(out.forces, compute_outputs(*model, b, {}).forces), 1e-14);
}

TEST(ForcesStress, StressMatchesFiniteDifferencesMixedBatch) {
  // Periodic crystal, slab (pbc T T F) and a molecule in one batch.
  SchNet model = small_model(3);
  Batch b = make_batch({random_periodic(5, {8, 13}, 4), molecule(), slab()}, kStressCutoff);
  ComputeOptions opt;
  opt.stress = true;
  ModelOutputs out = compute_outputs(*model, b, opt);
  EXPECT_EQ(out.stress.sizes(), (at::IntArrayRef{3, 3, 3}));
  at::Tensor fd = fd_stress(model, b);
  for (int64_t g : {0, 2}) {
    report("mixed-batch stress vs FD, graph " + std::to_string(g), rel_err(out.stress[g], fd[g]));
    EXPECT_LT(rel_err(out.stress[g], fd[g]), kTol) << "graph " << g;
  }
  // Non-periodic molecule: exactly zero stress, not NaN.
  EXPECT_TRUE(out.stress[1].eq(0).all().item<bool>());
  EXPECT_FALSE(out.stress.isnan().any().item<bool>());
  EXPECT_LT(rel_err(out.forces, fd_forces(model, b)), kTol);
}

TEST(ForcesStress, NonPeriodicStressIsExactlyZero) {
  SchNet model = small_model();
  Batch b = make_batch({molecule()}, kStressCutoff);
  ComputeOptions opt;
  opt.stress = true;
  for (bool training : {false, true}) {
    opt.training = training;
    ModelOutputs out = compute_outputs(*model, b, opt);
    ASSERT_TRUE(out.stress.defined());
    EXPECT_TRUE(out.stress.eq(0).all().item<bool>());
    EXPECT_TRUE(out.forces.isfinite().all().item<bool>());
  }
}

TEST(ForcesStress, StressWithoutCellThrows) {
  SchNet model = small_model();
  Batch b = make_batch({molecule()}, kStressCutoff);
  b.cell = at::Tensor();
  b.shifts = at::Tensor();
  ComputeOptions opt;
  opt.stress = true;
  EXPECT_THROW(compute_outputs(*model, b, opt), std::invalid_argument);
  // Energy and forces still work without a cell (no shifts applied).
  EXPECT_NO_THROW(compute_outputs(*model, b, {}));
}

TEST(ForcesStress, EvalOutputsAreDetached) {
  SchNet model = small_model();
  Batch b = make_batch({random_periodic(4, {13, 8}, 5)}, kStressCutoff);
  ComputeOptions opt;
  opt.stress = true;
  ModelOutputs out = compute_outputs(*model, b, opt);
  EXPECT_FALSE(out.energy.requires_grad());
  EXPECT_FALSE(out.forces.requires_grad());
  EXPECT_FALSE(out.stress.requires_grad());
  EXPECT_FALSE(b.positions.requires_grad());  // input batch untouched
  opt.forces = false;
  opt.stress = false;
  out = compute_outputs(*model, b, opt);
  EXPECT_FALSE(out.forces.defined());
  EXPECT_FALSE(out.stress.defined());
  EXPECT_FALSE(out.energy.requires_grad());
}

TEST(ForcesStress, IsolatedAtomHasZeroForces) {
  SchNet model = small_model();
  Structure s = make_structure({0.1, 0.2, 0.3}, {8}, std::vector<double>(9, 0.0), {false, false, false});
  Batch b = make_batch({s}, kStressCutoff);
  ASSERT_EQ(b.num_edges(), 0);
  ComputeOptions opt;
  opt.stress = true;
  ModelOutputs out = compute_outputs(*model, b, opt);
  EXPECT_TRUE(out.forces.eq(0).all().item<bool>());
  EXPECT_TRUE(out.stress.eq(0).all().item<bool>());
  EXPECT_TRUE(out.energy.isfinite().all().item<bool>());
  opt.training = true;
  EXPECT_NO_THROW(compute_outputs(*model, b, opt));
}

TEST(ForcesStress, TrainingModeForceLossHasParameterGradients) {
  SchNet model = small_model();
  Structure s = random_periodic(5, {13, 8}, 6);
  s.forces = at::randn({5, 3}, at::kDouble);
  s.stress = at::randn({3, 3}, at::kDouble) * 0.01;
  Batch b = make_batch({s, molecule()}, kStressCutoff);
  b.forces = at::randn_like(b.forces);
  b.has_forces = at::ones({2}, at::kBool);
  ComputeOptions opt;
  opt.stress = true;
  opt.training = true;
  ModelOutputs out = compute_outputs(*model, b, opt);
  EXPECT_TRUE(out.forces.requires_grad());
  EXPECT_TRUE(out.stress.requires_grad());
  ForcesMSELoss floss;
  StressMSELoss sloss;
  at::Tensor loss = floss(out, b) + sloss(out, b);
  model->zero_grad();
  loss.backward();
  int64_t nonzero = 0;
  for (const auto& p : model->named_parameters()) {
    const at::Tensor& g = p.value().grad();
    if (p.key() == "out2.bias") {
      // Forces and stress do not depend on the output bias.
      EXPECT_TRUE(!g.defined() || g.abs().sum().item<double>() == 0.0);
      continue;
    }
    ASSERT_TRUE(g.defined()) << p.key();
    EXPECT_TRUE(g.isfinite().all().item<bool>()) << p.key();
    if (g.abs().sum().item<double>() > 0) ++nonzero;
  }
  EXPECT_EQ(nonzero, static_cast<int64_t>(model->parameters().size()) - 1);
}

TEST(ForcesStress, ForceLossParameterGradientMatchesFiniteDifferences) {
  SchNet model = small_model();
  Structure s = random_periodic(5, {13, 8}, 8);
  Batch b = make_batch({s}, kStressCutoff);
  b.forces = at::randn_like(b.forces);
  b.has_forces = at::ones({1}, at::kBool);
  b.stress = at::randn_like(b.stress) * 0.01;
  b.has_stress = at::ones({1}, at::kBool);
  ComputeOptions opt;
  opt.stress = true;
  opt.training = true;
  ForcesMSELoss floss;
  StressMSELoss sloss;
  auto loss_of = [&](bool training) {
    ComputeOptions o = opt;
    o.training = training;
    ModelOutputs out = compute_outputs(*model, b, o);
    return floss(out, b) + 10.0 * sloss(out, b);
  };
  model->zero_grad();
  loss_of(true).backward();
  for (const char* name : {"filter1.0.weight", "in2f.1.weight", "dense.0.bias", "out1.weight"}) {
    at::Tensor p = model->named_parameters()[name];
    const at::Tensor g = p.grad().flatten();
    for (int64_t k : {int64_t{0}, p.numel() / 2}) {
      const double analytic = g[k].item<double>();
      at::Tensor flat = p.detach().view({-1});
      const double orig = flat[k].item<double>();
      flat[k] = orig + kStep;
      const double lp = loss_of(false).item<double>();
      flat[k] = orig - kStep;
      const double lm = loss_of(false).item<double>();
      flat[k] = orig;
      const double numeric = (lp - lm) / (2 * kStep);
      std::printf("    [info] dL/d%s[%lld] = %.10e (FD %.10e)\n", name, static_cast<long long>(k), analytic, numeric);
      report(std::string("dL/d") + name + "[" + std::to_string(k) + "] vs FD, relative error",
             std::abs(analytic - numeric) / std::abs(numeric));
      // 1e-6 relative, plus the FD round-off floor ~ eps · L / h ≈ 1e-11 absolute.
      EXPECT_NEAR(analytic, numeric, kTol * std::abs(numeric) + 1e-10) << name << "[" << k << "]";
      EXPECT_NE(analytic, 0.0) << name << "[" << k << "]";
    }
  }
}

TEST(ForcesStress, Float32MatchesFloat64) {
  SchNet model = small_model();
  Batch b64 = make_batch({random_periodic(5, {13, 8}, 9), molecule()}, kStressCutoff);
  ComputeOptions opt;
  opt.stress = true;
  ModelOutputs ref = compute_outputs(*model, b64, opt);
  model->to(at::kFloat);
  Batch b32 = b64;
  for (at::Tensor* t : {&b32.positions, &b32.shifts, &b32.cell}) *t = t->to(at::kFloat);
  ModelOutputs out = compute_outputs(*model, b32, opt);
  EXPECT_EQ(out.energy.scalar_type(), at::kDouble);  // energies are summed in float64 (issue 48)
  EXPECT_EQ(out.forces.scalar_type(), at::kFloat);
  EXPECT_EQ(out.stress.scalar_type(), at::kFloat);
  EXPECT_LT(rel_err(out.energy.to(at::kDouble), ref.energy), 1e-5);
  EXPECT_LT(rel_err(out.forces.to(at::kDouble), ref.forces), 1e-4);
  EXPECT_LT(rel_err(out.stress.to(at::kDouble), ref.stress), 1e-4);
}

}  // namespace
}  // namespace crucible
