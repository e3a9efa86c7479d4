// Losses against hand-computed values on a tiny hand-built batch.

#include "crucible/losses/loss.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace crucible {
namespace {

at::Tensor dvec(std::vector<double> v) { return at::tensor(v, at::kDouble); }
at::Tensor bvec(std::vector<int64_t> v) { return at::tensor(v, at::kLong).to(at::kBool); }

/// 3 structures with 2, 1, 3 atoms (no edges: losses do not need them).
///   energy: labelled [T, T, F]; forces: [T, F, T]; stress: [F, T, T]
///   weight [1, 2, 1], energy_weight [1, 0.5, 1], forces_weight [2, 1, 0.5],
///   stress_weight [1, 3, 1].
Batch tiny_batch() {
  Batch b;
  b.positions = at::zeros({6, 3}, at::kDouble);
  b.atomic_numbers = at::ones({6}, at::kLong);
  b.batch = at::tensor(std::vector<int64_t>{0, 0, 1, 2, 2, 2}, at::kLong);
  b.ptr = at::tensor(std::vector<int64_t>{0, 2, 3, 6}, at::kLong);
  b.num_atoms = at::tensor(std::vector<int64_t>{2, 1, 3}, at::kLong);
  b.edge_index = at::zeros({2, 0}, at::kLong);
  b.shifts = at::zeros({0, 3}, at::kDouble);
  b.cell = at::zeros({3, 3, 3}, at::kDouble);
  b.pbc = at::zeros({3, 3}, at::kBool);
  b.energy = dvec({0.0, 2.5, 1.0});
  b.forces = at::zeros({6, 3}, at::kDouble);
  b.forces[1] = dvec({1.0, 1.0, 3.0});
  b.forces[2] = dvec({100.0, 100.0, 100.0});  // unlabelled structure: ignored
  b.stress = at::zeros({3, 3, 3}, at::kDouble);
  b.stress[0] = at::full({3, 3}, 50.0, at::kDouble);  // unlabelled: ignored
  b.stress[1] = 0.1 * at::eye(3, at::kDouble);
  b.stress[2] = at::full({3, 3}, 0.2, at::kDouble);
  b.has_energy = bvec({1, 1, 0});
  b.has_forces = bvec({1, 0, 1});
  b.has_stress = bvec({0, 1, 1});
  b.weight = dvec({1.0, 2.0, 1.0});
  b.energy_weight = dvec({1.0, 0.5, 1.0});
  b.forces_weight = dvec({2.0, 1.0, 0.5});
  b.stress_weight = dvec({1.0, 3.0, 1.0});
  b.config_types = {"a", "b", "c"};
  return b;
}

ModelOutputs tiny_pred() {
  ModelOutputs p;
  p.energy = dvec({1.0, 2.0, std::numeric_limits<double>::quiet_NaN()});  // NaN where unlabelled
  p.forces = at::ones({6, 3}, at::kDouble);
  p.forces[2] = std::numeric_limits<double>::quiet_NaN();
  p.stress = at::zeros({3, 3, 3}, at::kDouble);
  return p;
}

// Energy per atom: s0: ((1-0)/2)² · 1 = 0.25; s1: ((2-2.5)/1)² · (2·0.5) = 0.25;
// mean over 2 labelled → 0.25.
constexpr double kEnergyPerAtom = 0.25;
// Energy total: s0: 1² · 1 = 1; s1: 0.5² · 1 = 0.25 → 0.625.
constexpr double kEnergyTotal = 0.625;
// Forces: atom0 (1,1,1)²·2 = 6; atom1 (0,0,-2)²·2 = 8; atoms 3..5: 9 · 0.5 = 4.5
// → 18.5 over 5 atoms · 3 components.
constexpr double kForces = 18.5 / 15.0;
// Stress: s1: 3 · 0.01 · (2·3) = 0.18; s2: 9 · 0.04 · 1 = 0.36 → 0.54 / 18.
constexpr double kStress = 0.54 / 18.0;

TEST(Losses, EnergyPerAtomHandComputed) {
  at::Tensor l = EnergyMSELoss()(tiny_pred(), tiny_batch());
  EXPECT_EQ(l.dim(), 0);
  EXPECT_NEAR(l.item<double>(), kEnergyPerAtom, 1e-15);
  EXPECT_EQ(EnergyMSELoss().name(), "energy");
  EXPECT_FALSE(EnergyMSELoss().needs_forces());
  EXPECT_FALSE(EnergyMSELoss().needs_stress());
}

TEST(Losses, EnergyTotalHandComputed) {
  at::Tensor l = EnergyMSELoss(/*per_atom=*/false)(tiny_pred(), tiny_batch());
  EXPECT_NEAR(l.item<double>(), kEnergyTotal, 1e-15);
}

TEST(Losses, ForcesHandComputed) {
  ForcesMSELoss loss;
  EXPECT_NEAR(loss(tiny_pred(), tiny_batch()).item<double>(), kForces, 1e-15);
  EXPECT_TRUE(loss.needs_forces());
  EXPECT_EQ(loss.name(), "forces");
}

TEST(Losses, StressHandComputed) {
  StressMSELoss loss;
  EXPECT_NEAR(loss(tiny_pred(), tiny_batch()).item<double>(), kStress, 1e-15);
  EXPECT_TRUE(loss.needs_stress());
  EXPECT_EQ(loss.name(), "stress");
}

TEST(Losses, EnergyGradientHandComputed) {
  ModelOutputs p = tiny_pred();
  p.energy = dvec({1.0, 2.0, 7.0}).requires_grad_(true);
  at::Tensor l = EnergyMSELoss()(p, tiny_batch());
  l.backward();
  // d/dE_s of (1/2) Σ w_s (ΔE_s/N_s)² = w_s ΔE_s / N_s².
  at::Tensor g = p.energy.grad();
  EXPECT_NEAR(g[0].item<double>(), 1.0 * 1.0 / 4.0, 1e-15);
  EXPECT_NEAR(g[1].item<double>(), 1.0 * -0.5 / 1.0, 1e-15);
  EXPECT_EQ(g[2].item<double>(), 0.0);
}

TEST(Losses, MissingLabelsGiveZero) {
  Batch b = tiny_batch();
  b.has_energy = bvec({0, 0, 0});
  b.has_forces = bvec({0, 0, 0});
  b.has_stress = bvec({0, 0, 0});
  ModelOutputs p = tiny_pred();
  p.energy = dvec({1.0, 2.0, 3.0}).requires_grad_(true);
  for (const LossFunction* loss : std::initializer_list<const LossFunction*>{
           new EnergyMSELoss(), new ForcesMSELoss(), new StressMSELoss()}) {
    at::Tensor l = (*loss)(p, b);
    EXPECT_EQ(l.dim(), 0);
    EXPECT_EQ(l.item<double>(), 0.0) << loss->name();
    EXPECT_EQ(l.scalar_type(), at::kDouble);
    delete loss;
  }
  // Still differentiable (zero gradient), so a training step does not crash.
  at::Tensor l = EnergyMSELoss()(p, b);
  l.backward();
  EXPECT_EQ(p.energy.grad().abs().sum().item<double>(), 0.0);
}

TEST(Losses, MissingPredictionThrows) {
  ModelOutputs p;
  p.energy = dvec({1.0, 2.0, 3.0});
  EXPECT_THROW(ForcesMSELoss()(p, tiny_batch()), std::invalid_argument);
  EXPECT_THROW(StressMSELoss()(p, tiny_batch()), std::invalid_argument);
  EXPECT_NO_THROW(EnergyMSELoss()(p, tiny_batch()));
}

TEST(Losses, Float32PredictionsGiveFloat32Loss) {
  ModelOutputs p = tiny_pred();
  p.energy = p.energy.to(at::kFloat);
  p.forces = p.forces.to(at::kFloat);
  p.stress = p.stress.to(at::kFloat);
  Batch b = tiny_batch();  // float64 labels are cast to the predictions' dtype
  EXPECT_EQ(EnergyMSELoss()(p, b).scalar_type(), at::kFloat);
  EXPECT_NEAR(ForcesMSELoss()(p, b).item<double>(), kForces, 1e-6);
  EXPECT_NEAR(StressMSELoss()(p, b).item<double>(), kStress, 1e-7);
}

TEST(Losses, WeightedSumTotalAndComponents) {
  WeightedSumLoss loss;
  EXPECT_TRUE(loss.empty());
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  EXPECT_FALSE(loss.needs_forces());
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  EXPECT_TRUE(loss.needs_forces());
  EXPECT_FALSE(loss.needs_stress());
  loss.add(std::make_shared<StressMSELoss>(), 100.0);
  EXPECT_TRUE(loss.needs_stress());
  EXPECT_FALSE(loss.empty());

  LossOutput out = loss(tiny_pred(), tiny_batch());
  ASSERT_EQ(out.components.size(), 3u);
  EXPECT_NEAR(out.components.at("energy").item<double>(), kEnergyPerAtom, 1e-15);
  EXPECT_NEAR(out.components.at("forces").item<double>(), kForces, 1e-15);
  EXPECT_NEAR(out.components.at("stress").item<double>(), kStress, 1e-15);
  EXPECT_EQ(out.weights.at("energy"), 1.0);
  EXPECT_EQ(out.weights.at("forces"), 10.0);
  EXPECT_EQ(out.weights.at("stress"), 100.0);
  EXPECT_NEAR(out.total.item<double>(), 1.0 * kEnergyPerAtom + 10.0 * kForces + 100.0 * kStress, 1e-13);
  double sum = 0;
  for (const auto& [name, value] : out.components) sum += out.weights.at(name) * value.item<double>();
  EXPECT_NEAR(out.total.item<double>(), sum, 1e-13);
}

TEST(Losses, WeightedSumRejectsBadTerms) {
  WeightedSumLoss loss;
  EXPECT_THROW(loss.add(std::make_shared<EnergyMSELoss>(), -1.0), std::invalid_argument);
  EXPECT_THROW(loss.add(std::make_shared<EnergyMSELoss>(), std::nan("")), std::invalid_argument);
  EXPECT_THROW(loss.add(nullptr, 1.0), std::invalid_argument);
  loss.add(std::make_shared<EnergyMSELoss>(), 0.0);  // zero weight is allowed
  EXPECT_THROW(loss.add(std::make_shared<EnergyMSELoss>(false), 1.0), std::invalid_argument);
}

TEST(Losses, WeightedSumUnlabelledComponentContributesZero) {
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<StressMSELoss>(), 100.0);
  Batch b = tiny_batch();
  b.has_stress = bvec({0, 0, 0});
  LossOutput out = loss(tiny_pred(), b);
  EXPECT_EQ(out.components.at("stress").item<double>(), 0.0);
  EXPECT_NEAR(out.total.item<double>(), kEnergyPerAtom, 1e-15);
}

TEST(Losses, EmptyWeightedSumIsZero) {
  WeightedSumLoss loss;
  ModelOutputs p;
  p.energy = dvec({1.0, 2.0, 3.0});
  LossOutput out = loss(p, tiny_batch());
  EXPECT_EQ(out.total.item<double>(), 0.0);
  EXPECT_TRUE(out.components.empty());
}

}  // namespace
}  // namespace crucible
