// Losses against hand-computed values on a tiny hand-built batch, and
// (issue 4, deliverable 6) MSE / MAE / Huber terms, config_type weights,
// weight normalization and loss-weight schedules: values and gradients against
// PyTorch (tests/models/oracles/loss_oracle.py), schedules at hand-computed
// points, and the error messages.

#include "common/python_oracle.h"
#include "crucible/losses/loss.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

TEST(Losses, Float32PredictionsGiveFloat32ForceAndStressTermsAndAFloat64EnergyTerm) {
  ModelOutputs p = tiny_pred();
  p.energy = p.energy.to(at::kFloat);
  p.forces = p.forces.to(at::kFloat);
  p.stress = p.stress.to(at::kFloat);
  Batch b = tiny_batch();  // float64 labels are cast to the predictions' dtype
  // ... except in the energy term, whose difference is float64 in every mode (issue 48).
  EXPECT_EQ(EnergyMSELoss()(p, b).scalar_type(), at::kDouble);
  EXPECT_EQ(ForcesMSELoss()(p, b).scalar_type(), at::kFloat);
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

// ---------------------------------------------------------------------------
// Issue 4, deliverable 6: loss kinds, config_type weights, normalization,
// schedules.

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Runs `fn`, expecting std::invalid_argument whose message contains `part`.
void expect_invalid(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no std::invalid_argument (expected a message with '" << part << "')";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

std::shared_ptr<LossFunction> make_term(const std::string& prop, LossKind kind,
                                        const std::string& option, double delta) {
  if (prop == "energy") return std::make_shared<EnergyLoss>(kind, option == "per_atom", delta);
  if (prop == "forces") return std::make_shared<ForcesLoss>(kind, parse_forces_mode(option), delta);
  return std::make_shared<StressLoss>(kind, delta);
}

// ----- Oracle (PyTorch) -----

/// One record of loss_oracle.py: key and its tokens.
using Records = std::multimap<std::string, std::vector<std::string>>;

const Records& oracle_records() {
  static const Records records = [] {
    Records out;
    std::istringstream in(crucible::testing::run_python(
        std::string(CRUCIBLE_SOURCE_DIR) + "/tests/models/oracles/loss_oracle.py"));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string key, tok;
      ls >> key;
      std::vector<std::string> toks;
      while (ls >> tok) toks.push_back(tok);
      if (!key.empty()) out.emplace(key, toks);
    }
    return out;
  }();
  return records;
}

/// strtod accepts "nan" (operator>> does not).
std::vector<double> numbers(const std::vector<std::string>& toks, size_t from = 0) {
  std::vector<double> v;
  for (size_t i = from; i < toks.size(); ++i) v.push_back(std::strtod(toks[i].c_str(), nullptr));
  return v;
}

std::vector<double> field(const std::string& key) {
  const auto it = oracle_records().find(key);
  if (it == oracle_records().end()) throw std::runtime_error("oracle lacks '" + key + "'");
  return numbers(it->second);
}

at::Tensor bool_field(const std::string& key) { return dvec(field(key)).to(at::kBool); }

/// The oracle's batch (float64, no edges: losses do not need them).
Batch oracle_batch() {
  const std::vector<double> n = field("num_atoms");
  const int64_t B = static_cast<int64_t>(n.size());
  std::vector<int64_t> graph, ptr{0}, counts;
  for (int64_t s = 0; s < B; ++s) {
    counts.push_back(static_cast<int64_t>(n[s]));
    for (int64_t a = 0; a < counts.back(); ++a) graph.push_back(s);
    ptr.push_back(ptr.back() + counts.back());
  }
  const int64_t N = ptr.back();
  Batch b;
  b.positions = at::zeros({N, 3}, at::kDouble);
  b.atomic_numbers = at::ones({N}, at::kLong);
  b.batch = at::tensor(graph, at::kLong);
  b.ptr = at::tensor(ptr, at::kLong);
  b.num_atoms = at::tensor(counts, at::kLong);
  b.edge_index = at::zeros({2, 0}, at::kLong);
  b.shifts = at::zeros({0, 3}, at::kDouble);
  b.cell = at::zeros({B, 3, 3}, at::kDouble);
  b.pbc = at::zeros({B, 3}, at::kBool);
  b.energy = dvec(field("energy_ref"));
  b.forces = dvec(field("forces_ref")).view({N, 3});
  b.stress = dvec(field("stress_ref")).view({B, 3, 3});
  b.has_energy = bool_field("has_energy");
  b.has_forces = bool_field("has_forces");
  b.has_stress = bool_field("has_stress");
  b.weight = dvec(field("weight"));
  b.energy_weight = dvec(field("energy_weight"));
  b.forces_weight = dvec(field("forces_weight"));
  b.stress_weight = dvec(field("stress_weight"));
  b.config_types = oracle_records().find("config_types")->second;
  return b;
}

/// The oracle's predictions (NaN at unlabelled items), leaves requiring grad.
ModelOutputs oracle_pred(const Batch& b) {
  ModelOutputs p;
  p.energy = dvec(field("energy_pred")).requires_grad_(true);
  p.forces = dvec(field("forces_pred")).view({b.num_nodes(), 3}).detach().requires_grad_(true);
  p.stress = dvec(field("stress_pred")).view({b.num_graphs(), 3, 3}).detach().requires_grad_(true);
  return p;
}

std::map<std::string, double> oracle_ct_weights() {
  const auto& toks = oracle_records().find("ct_weights")->second;
  std::map<std::string, double> out;
  for (size_t i = 0; i + 1 < toks.size(); i += 2) out[toks[i]] = std::strtod(toks[i + 1].c_str(), nullptr);
  return out;
}

void expect_rel(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::abs(want))) << what;
}

TEST(LossesOracle, EveryKindAndModeMatchesPyTorch) {
  if (!crucible::testing::python_has("torch")) GTEST_SKIP() << "torch unavailable at " << CRUCIBLE_PYTHON;
  ASSERT_FALSE(oracle_records().empty()) << "loss_oracle.py failed";
  const Batch batch = oracle_batch();
  const auto ct = oracle_ct_weights();
  ASSERT_EQ(ct.size(), 4u);
  // Unlabelled items really carry NaN predictions (the masks are exercised).
  ASSERT_TRUE(std::isnan(oracle_pred(batch).energy[2].item<double>()));

  size_t cases = 0;
  const auto range = oracle_records().equal_range("case");
  for (auto it = range.first; it != range.second; ++it, ++cases) {
    const auto& t = it->second;  // prop kind option delta value_ct value_noct grad...
    ASSERT_GE(t.size(), 7u);
    const std::string what = t[0] + " " + t[1] + " " + t[2];
    const double delta = std::strtod(t[3].c_str(), nullptr);
    const double value_ct = std::strtod(t[4].c_str(), nullptr);
    const double value_noct = std::strtod(t[5].c_str(), nullptr);
    const std::vector<double> grad = numbers(t, 6);
    auto term = make_term(t[0], parse_loss_kind(t[1]), t[2], delta);
    EXPECT_EQ(term->name(), t[0]);

    // Plain operator(): the batch's own weights only.
    ModelOutputs p = oracle_pred(batch);
    expect_rel((*term)(p, batch).item<double>(), value_noct, what + " (no config_type weights)");

    // Through WeightedSumLoss with the config_type weights, and the gradient.
    WeightedSumLoss loss;
    loss.set_config_type_weights(ct);
    loss.add(term, 1.0);
    LossOutput out = loss(p, batch);
    expect_rel(out.components.at(t[0]).item<double>(), value_ct, what);
    expect_rel(out.total.item<double>(), value_ct, what + " total");
    out.total.backward();
    const at::Tensor leaf = t[0] == "energy" ? p.energy : t[0] == "forces" ? p.forces : p.stress;
    ASSERT_TRUE(leaf.grad().defined()) << what;
    const at::Tensor g = leaf.grad().flatten();
    ASSERT_EQ(g.numel(), static_cast<int64_t>(grad.size())) << what;
    for (int64_t i = 0; i < g.numel(); ++i) {
      EXPECT_NEAR(g[i].item<double>(), grad[i], 1e-12 * std::max(1.0, std::abs(grad[i])))
          << what << " gradient entry " << i;
    }
  }
  EXPECT_EQ(cases, 15u);  // energy 3 kinds × 2, forces 3 × 2, stress 3
}

TEST(LossesOracle, NormalizedSumWithConfigTypeWeightsMatchesPyTorch) {
  if (!crucible::testing::python_has("torch")) GTEST_SKIP() << "torch unavailable at " << CRUCIBLE_PYTHON;
  ASSERT_FALSE(oracle_records().empty()) << "loss_oracle.py failed";
  const Batch batch = oracle_batch();
  WeightedSumLoss loss;
  loss.set_config_type_weights(oracle_ct_weights());
  loss.set_normalize_weights(true);
  loss.add(std::make_shared<EnergyLoss>(LossKind::Huber, true, 0.3), 1.0);
  loss.add(std::make_shared<ForcesLoss>(LossKind::MAE, ForcesMode::Vector), 10.0);
  loss.add(std::make_shared<StressLoss>(LossKind::MSE), 100.0);
  const LossOutput out = loss(oracle_pred(batch), batch);
  expect_rel(out.total.item<double>(), field("sum").at(0), "normalized total");
  EXPECT_TRUE(std::isfinite(out.total.item<double>()));
}

// ----- Hand-computed values on the tiny batch -----

TEST(Losses, ForcesVectorModeHandComputed) {
  // Errors: atom0 (1,1,1) |·|=√3, w 2; atom1 (0,0,-2) |·|=2, w 2; atoms 3..5
  // (1,1,1) w 0.5; 5 labelled atoms.
  const double r3 = std::sqrt(3.0);
  EXPECT_NEAR(ForcesLoss(LossKind::MSE, ForcesMode::Vector)(tiny_pred(), tiny_batch()).item<double>(),
              (6.0 + 8.0 + 4.5) / 5.0, 1e-15);
  EXPECT_NEAR(ForcesLoss(LossKind::MAE, ForcesMode::Vector)(tiny_pred(), tiny_batch()).item<double>(),
              (2.0 * r3 + 4.0 + 1.5 * r3) / 5.0, 1e-15);
  // Huber δ=1.9: √3 < δ → ½·3; 2 ≥ δ → 1.9·(2 - 0.95).
  EXPECT_NEAR(ForcesLoss(LossKind::Huber, ForcesMode::Vector, 1.9)(tiny_pred(), tiny_batch()).item<double>(),
              (2.0 * 1.5 + 2.0 * 1.9 * 1.05 + 1.5 * 1.5) / 5.0, 1e-15);
  // MAE per component: Σ w|d| = 2·3 + 2·2 + 0.5·9 = 14.5 over 15 components.
  EXPECT_NEAR(ForcesLoss(LossKind::MAE)(tiny_pred(), tiny_batch()).item<double>(), 14.5 / 15.0, 1e-15);
}

TEST(Losses, EnergyAndStressMaeHuberHandComputed) {
  // Energy per atom d = (0.5, -0.5), w = (1, 1): MAE 0.5; Huber δ=0.4: 0.4·(0.5-0.2) = 0.12.
  EXPECT_NEAR(EnergyLoss(LossKind::MAE)(tiny_pred(), tiny_batch()).item<double>(), 0.5, 1e-15);
  EXPECT_NEAR(EnergyLoss(LossKind::Huber, true, 0.4)(tiny_pred(), tiny_batch()).item<double>(), 0.12, 1e-15);
  // Energy total d = (1, -0.5): Huber δ=1 (|d| = δ is the linear branch, equal value): (0.5 + 0.125)/2.
  EXPECT_NEAR(EnergyLoss(LossKind::Huber, false, 1.0)(tiny_pred(), tiny_batch()).item<double>(), 0.3125, 1e-15);
  // Stress MAE: s1 3·0.1·6 = 1.8, s2 9·0.2·1 = 1.8 → 3.6/18.
  EXPECT_NEAR(StressLoss(LossKind::MAE)(tiny_pred(), tiny_batch()).item<double>(), 0.2, 1e-15);
  // Stress Huber δ=0.15: s1 3·½·0.01·6 = 0.09, s2 9·0.15·(0.2-0.075) = 0.16875.
  EXPECT_NEAR(StressLoss(LossKind::Huber, 0.15)(tiny_pred(), tiny_batch()).item<double>(),
              (0.09 + 0.16875) / 18.0, 1e-15);
}

TEST(Losses, MseClassesEqualGeneralMse) {
  const auto p = tiny_pred();
  const auto b = tiny_batch();
  EXPECT_EQ(EnergyMSELoss(false)(p, b).item<double>(), EnergyLoss(LossKind::MSE, false)(p, b).item<double>());
  EXPECT_EQ(ForcesMSELoss()(p, b).item<double>(), ForcesLoss()(p, b).item<double>());
  EXPECT_EQ(StressMSELoss()(p, b).item<double>(), StressLoss()(p, b).item<double>());
  EXPECT_EQ(ForcesMSELoss().mode(), ForcesMode::Component);
  EXPECT_EQ(EnergyMSELoss().kind(), LossKind::MSE);
  EXPECT_TRUE(EnergyMSELoss().per_atom());
}

TEST(Losses, NaNAtUnlabelledItemsGivesZeroGradientForEveryKind) {
  for (LossKind kind : {LossKind::MSE, LossKind::MAE, LossKind::Huber}) {
    for (ForcesMode mode : {ForcesMode::Component, ForcesMode::Vector}) {
      ModelOutputs p = tiny_pred();
      p.forces.requires_grad_(true);
      at::Tensor l = ForcesLoss(kind, mode, 0.5)(p, tiny_batch());
      ASSERT_TRUE(std::isfinite(l.item<double>())) << to_string(kind) << " " << to_string(mode);
      l.backward();
      const at::Tensor g = p.forces.grad();
      EXPECT_TRUE(g.isfinite().all().item<bool>()) << to_string(kind) << " " << to_string(mode);
      EXPECT_EQ(g[2].abs().sum().item<double>(), 0.0) << "unlabelled atom";
      EXPECT_GT(g[0].abs().sum().item<double>(), 0.0) << "labelled atom";
    }
    ModelOutputs p = tiny_pred();
    p.energy.requires_grad_(true);
    EnergyLoss(kind, true, 0.5)(p, tiny_batch()).backward();
    EXPECT_EQ(p.energy.grad()[2].item<double>(), 0.0) << to_string(kind);
  }
}

TEST(Losses, VectorModeZeroErrorHasZeroGradient) {
  ModelOutputs p = tiny_pred();
  p.forces[0] = 0.0;  // atom 0 of structure 0: error exactly zero
  p.forces.requires_grad_(true);
  for (LossKind kind : {LossKind::MAE, LossKind::Huber}) {
    p.forces.mutable_grad() = at::Tensor();
    ForcesLoss(kind, ForcesMode::Vector)(p, tiny_batch()).backward();
    EXPECT_TRUE(p.forces.grad().isfinite().all().item<bool>()) << to_string(kind);
    EXPECT_EQ(p.forces.grad()[0].abs().sum().item<double>(), 0.0) << to_string(kind);
  }
}

TEST(Losses, HuberGradientHandComputed) {
  // Energy per atom, δ=0.4: d = (0.5, -0.5) ≥ δ → ∂/∂E_s = w_s δ sign(d_s) / N_s / 2.
  ModelOutputs p = tiny_pred();
  p.energy = dvec({1.0, 2.0, kNaN}).requires_grad_(true);
  EnergyLoss(LossKind::Huber, true, 0.4)(p, tiny_batch()).backward();
  EXPECT_NEAR(p.energy.grad()[0].item<double>(), 0.4 / 2.0 / 2.0, 1e-15);
  EXPECT_NEAR(p.energy.grad()[1].item<double>(), -0.4 / 1.0 / 2.0, 1e-15);
  // δ=1: |d| < δ → w_s d_s / N_s / 2 (the MSE gradient halved).
  p.energy.mutable_grad() = at::Tensor();
  EnergyLoss(LossKind::Huber, true, 1.0)(p, tiny_batch()).backward();
  EXPECT_NEAR(p.energy.grad()[0].item<double>(), 0.5 / 2.0 / 2.0, 1e-15);
  EXPECT_NEAR(p.energy.grad()[1].item<double>(), -0.5 / 2.0, 1e-15);
}

TEST(Losses, EveryKindGivesConnectedZeroWithoutLabels) {
  Batch b = tiny_batch();
  b.has_energy = bvec({0, 0, 0});
  b.has_forces = bvec({0, 0, 0});
  b.has_stress = bvec({0, 0, 0});
  for (LossKind kind : {LossKind::MSE, LossKind::MAE, LossKind::Huber}) {
    for (const auto& term : std::vector<std::shared_ptr<LossFunction>>{
             std::make_shared<EnergyLoss>(kind), std::make_shared<EnergyLoss>(kind, false),
             std::make_shared<ForcesLoss>(kind, ForcesMode::Component),
             std::make_shared<ForcesLoss>(kind, ForcesMode::Vector), std::make_shared<StressLoss>(kind)}) {
      ModelOutputs p = tiny_pred();
      p.energy.requires_grad_(true);
      p.forces.requires_grad_(true);
      p.stress.requires_grad_(true);
      at::Tensor l = (*term)(p, b);
      EXPECT_EQ(l.dim(), 0);
      EXPECT_EQ(l.item<double>(), 0.0) << term->name() << " " << to_string(kind);
      EXPECT_TRUE(l.requires_grad()) << term->name() << " " << to_string(kind);
    }
  }
}

TEST(Losses, EmptyBatchGivesConnectedZero) {
  Batch b;
  b.positions = at::zeros({0, 3}, at::kDouble);
  b.batch = at::zeros({0}, at::kLong);
  b.num_atoms = at::zeros({0}, at::kLong);
  b.energy = at::zeros({0}, at::kDouble);
  b.forces = at::zeros({0, 3}, at::kDouble);
  b.stress = at::zeros({0, 3, 3}, at::kDouble);
  b.has_energy = b.has_forces = b.has_stress = at::zeros({0}, at::kBool);
  b.weight = b.energy_weight = b.forces_weight = b.stress_weight = at::zeros({0}, at::kDouble);
  ModelOutputs p;
  p.energy = at::zeros({0}, at::kDouble).requires_grad_(true);
  p.forces = at::zeros({0, 3}, at::kDouble).requires_grad_(true);
  p.stress = at::zeros({0, 3, 3}, at::kDouble).requires_grad_(true);
  WeightedSumLoss loss;
  loss.set_config_type_weights({{"a", 2.0}});
  loss.add(std::make_shared<EnergyLoss>(LossKind::Huber), 1.0);
  loss.add(std::make_shared<ForcesLoss>(LossKind::MAE, ForcesMode::Vector), 1.0);
  loss.add(std::make_shared<StressLoss>(LossKind::MAE), 1.0);
  LossOutput out = loss(p, b);
  EXPECT_EQ(out.total.item<double>(), 0.0);
  ASSERT_TRUE(out.total.requires_grad());
  out.total.backward();
  EXPECT_TRUE(p.forces.grad().defined());
}

TEST(Losses, InvalidOptionsThrow) {
  expect_invalid([] { EnergyLoss(LossKind::Huber, true, 0.0); }, "delta must be a finite number > 0, got 0");
  expect_invalid([] { ForcesLoss(LossKind::Huber, ForcesMode::Vector, -1.0); }, "ForcesLoss: Huber delta");
  expect_invalid([] { StressLoss(LossKind::Huber, kNaN); }, "got nan");
  EXPECT_NO_THROW(StressLoss(LossKind::MAE, 0.0));  // δ unused by MAE
  expect_invalid([] { parse_loss_kind("l2"); }, "loss kind must be one of mse, mae, huber, got 'l2'");
  expect_invalid([] { parse_forces_mode("norm"); }, "forces mode must be one of component, vector, got 'norm'");
  expect_invalid([] { parse_schedule_clock("batch"); }, "got 'batch'");
  for (LossKind k : {LossKind::MSE, LossKind::MAE, LossKind::Huber}) EXPECT_EQ(parse_loss_kind(to_string(k)), k);
  for (ForcesMode m : {ForcesMode::Component, ForcesMode::Vector}) EXPECT_EQ(parse_forces_mode(to_string(m)), m);
  for (ScheduleClock c : {ScheduleClock::Step, ScheduleClock::Epoch}) EXPECT_EQ(parse_schedule_clock(to_string(c)), c);

  ModelOutputs p = tiny_pred();
  p.energy = dvec({1.0, 2.0});
  expect_invalid([&] { EnergyLoss()(p, tiny_batch()); }, "predicted energy must have the labels' shape [3], got [2]");
  expect_invalid([] { EnergyLoss().evaluate(tiny_pred(), tiny_batch(), dvec({1.0, 2.0})); },
                 "structure_weight must have shape [3], got [2]");
}

// ----- Config-type weights -----

TEST(Losses, ConfigTypeWeightsHandComputed) {
  // tiny batch config_types a, b, c. Energy per atom: s0 0.25·3, s1 0.25·0 → 0.75/2
  // (the zero-weight structure still counts in the denominator).
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 1.0);
  loss.add(std::make_shared<StressMSELoss>(), 1.0);
  loss.set_config_type_weights({{"a", 3.0}, {"b", 0.0}, {"zzz", 5.0}});
  EXPECT_EQ(loss.config_type_weights().size(), 3u);
  LossOutput out = loss(tiny_pred(), tiny_batch());
  EXPECT_NEAR(out.components.at("energy").item<double>(), 0.375, 1e-15);
  // Forces: atoms of a ×3 (6+8 → 42), c ×1 (4.5) → 46.5/15.
  EXPECT_NEAR(out.components.at("forces").item<double>(), 46.5 / 15.0, 1e-15);
  // Stress: b ×0 → only s2 0.36 / 18.
  EXPECT_NEAR(out.components.at("stress").item<double>(), 0.36 / 18.0, 1e-15);
  // An empty map switches the feature off.
  loss.set_config_type_weights({});
  out = loss(tiny_pred(), tiny_batch());
  EXPECT_NEAR(out.components.at("energy").item<double>(), kEnergyPerAtom, 1e-15);
}

TEST(Losses, ConfigTypeWeightErrors) {
  WeightedSumLoss loss;
  expect_invalid([&] { loss.set_config_type_weights({{"a", 1.0}, {"slab", -0.5}}); },
                 "config_type_weights['slab'] must be a finite number >= 0, got -0.5");
  expect_invalid([&] { loss.set_config_type_weights({{"bulk", kNaN}}); }, "'bulk'");
  expect_invalid([&] { loss.set_config_type_weights({{"gas", INFINITY}}); }, "'gas'");
  EXPECT_TRUE(loss.config_type_weights().empty());  // a rejected map is not kept
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.set_config_type_weights({{"a", 2.0}});
  Batch b = tiny_batch();
  b.config_types = {"a", "b"};
  expect_invalid([&] { loss(tiny_pred(), b); }, "batch.config_types must have B = 3 entries, got 2");
}

// ----- Normalization -----

TEST(Losses, NormalizedWeights) {
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  loss.add(std::make_shared<StressMSELoss>(), 100.0);
  EXPECT_FALSE(loss.normalize_weights());
  loss.set_normalize_weights(true);
  LossOutput out = loss(tiny_pred(), tiny_batch());
  EXPECT_NEAR(out.total.item<double>(), (kEnergyPerAtom + 10.0 * kForces + 100.0 * kStress) / 111.0, 1e-15);
  EXPECT_NEAR(out.components.at("forces").item<double>(), kForces, 1e-15);  // unweighted
  EXPECT_NEAR(out.weights.at("energy"), 1.0 / 111.0, 1e-17);
  EXPECT_NEAR(out.weights.at("stress"), 100.0 / 111.0, 1e-16);
  EXPECT_EQ(loss.current_weights().at("stress"), 100.0);  // before normalization

  WeightedSumLoss zero;
  zero.set_normalize_weights(true);
  zero.add(std::make_shared<EnergyMSELoss>(), 0.0);
  ModelOutputs p = tiny_pred();
  p.energy = dvec({1.0, 2.0, 3.0}).requires_grad_(true);
  out = zero(p, tiny_batch());
  EXPECT_EQ(out.total.item<double>(), 0.0);
  EXPECT_EQ(out.weights.at("energy"), 0.0);
  EXPECT_TRUE(out.total.requires_grad());
}

// ----- Schedules -----

TEST(LossWeightSchedules, ConstantAndLinear) {
  EXPECT_EQ(ConstantWeight(2.5).weight(100, 7), 2.5);
  const LinearWeight lin(1.0, 3.0, 2, 6);  // epoch clock by default
  EXPECT_EQ(lin.clock(), ScheduleClock::Epoch);
  const std::vector<std::pair<int64_t, double>> points{{0, 1.0}, {2, 1.0}, {3, 1.5}, {4, 2.0},
                                                       {5, 2.5}, {6, 3.0}, {50, 3.0}};
  for (const auto& [t, w] : points) {
    EXPECT_DOUBLE_EQ(lin.weight(/*step=*/1000, /*epoch=*/t), w) << "epoch " << t;
  }
  const LinearWeight down(10.0, 0.0, 0, 4, ScheduleClock::Step);
  EXPECT_DOUBLE_EQ(down.weight(/*step=*/1, /*epoch=*/99), 7.5);
  EXPECT_DOUBLE_EQ(down.weight(3, 0), 2.5);
  const LinearWeight jump(1.0, 5.0, 3, 3);  // start == end: a step at t = 3
  EXPECT_EQ(jump.value(2), 1.0);
  EXPECT_EQ(jump.value(3), 5.0);
}

TEST(LossWeightSchedules, Cosine) {
  const CosineWeight cos(2.0, 0.0, 10, 20, ScheduleClock::Step);
  EXPECT_DOUBLE_EQ(cos.weight(0, 50), 2.0);
  EXPECT_DOUBLE_EQ(cos.weight(10, 0), 2.0);
  EXPECT_NEAR(cos.weight(13, 0), 1.5877852522924731, 1e-15);  // 1 + cos(0.3π) = 1 + cos 54°
  EXPECT_NEAR(cos.weight(15, 0), 1.0, 1e-15);
  EXPECT_NEAR(cos.weight(17, 0), 0.41221474770752686, 1e-15);  // 1 + cos(0.7π)
  EXPECT_DOUBLE_EQ(cos.weight(20, 0), 0.0);
  EXPECT_DOUBLE_EQ(cos.weight(25, 0), 0.0);
  const CosineWeight up(1.0, 3.0, 0, 4);  // epoch clock
  EXPECT_NEAR(up.weight(0, 2), 2.0, 1e-15);
  EXPECT_NEAR(up.weight(0, 1), 2.0 - std::sqrt(0.5), 1e-15);  // 3 - 2·½(1 + cos 45°)
}

TEST(LossWeightSchedules, PiecewiseConstant) {
  const PiecewiseConstantWeight pw({5, 10}, {1.0, 0.5, 0.1}, ScheduleClock::Step);
  const std::vector<std::pair<int64_t, double>> points{{0, 1.0}, {4, 1.0}, {5, 0.5},
                                                       {9, 0.5}, {10, 0.1}, {1000, 0.1}};
  for (const auto& [t, w] : points) EXPECT_EQ(pw.weight(t, 0), w) << "step " << t;
  EXPECT_EQ(PiecewiseConstantWeight({}, {4.0}).weight(3, 3), 4.0);
}

TEST(LossWeightSchedules, InvalidArgumentsThrow) {
  expect_invalid([] { PiecewiseConstantWeight({5, 10}, {1.0, 0.5}); },
                 "values must have boundaries.size() + 1 = 3 entries, got 2");
  expect_invalid([] { PiecewiseConstantWeight({10, 5}, {1.0, 0.5, 0.1}); },
                 "boundaries must be strictly increasing, got 5 after 10");
  expect_invalid([] { PiecewiseConstantWeight({5, 5}, {1.0, 0.5, 0.1}); }, "strictly increasing");
  expect_invalid([] { PiecewiseConstantWeight({5}, {1.0, -2.0}); }, "values[1] must be a finite number >= 0, got -2");
  expect_invalid([] { LinearWeight(1.0, 2.0, 5, 4); }, "LinearWeight: end must be >= start (5), got 4");
  expect_invalid([] { LinearWeight(-1.0, 2.0, 0, 4); }, "LinearWeight: w0 must be a finite number >= 0, got -1");
  expect_invalid([] { CosineWeight(1.0, kNaN, 0, 4); }, "CosineWeight: w1 must be a finite number >= 0, got nan");
  expect_invalid([] { CosineWeight(1.0, 0.0, -1, 4); }, "start must be >= 0, got -1");
  expect_invalid([] { (void)ConstantWeight(INFINITY); }, "ConstantWeight: w must be");
}

/// A user schedule returning a bad weight must be caught by WeightedSumLoss.
class NegativeAfter : public LossWeightSchedule {
 public:
  NegativeAfter() : LossWeightSchedule(ScheduleClock::Step) {}
  double value(int64_t t) const override { return t < 3 ? 1.0 : -1.0; }
};

TEST(LossWeightSchedules, WeightedSumUsesScheduleAtProgress) {
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), std::make_shared<LinearWeight>(0.0, 1.0, 0, 10, ScheduleClock::Step));
  loss.add(std::make_shared<ForcesMSELoss>(),
           std::make_shared<PiecewiseConstantWeight>(std::vector<int64_t>{2}, std::vector<double>{10.0, 1.0}));
  LossOutput out = loss(tiny_pred(), tiny_batch());  // counters start at 0, 0
  EXPECT_EQ(out.weights.at("energy"), 0.0);
  EXPECT_EQ(out.weights.at("forces"), 10.0);
  EXPECT_NEAR(out.total.item<double>(), 10.0 * kForces, 1e-14);

  loss.set_progress(/*step=*/5, /*epoch=*/2);
  EXPECT_EQ(loss.step(), 5);
  EXPECT_EQ(loss.epoch(), 2);
  out = loss(tiny_pred(), tiny_batch());
  EXPECT_DOUBLE_EQ(out.weights.at("energy"), 0.5);
  EXPECT_EQ(out.weights.at("forces"), 1.0);
  EXPECT_NEAR(out.total.item<double>(), 0.5 * kEnergyPerAtom + kForces, 1e-14);
  EXPECT_NEAR(out.components.at("energy").item<double>(), kEnergyPerAtom, 1e-15);  // unweighted

  // Copies (as TrainingStrategy keeps) share schedules but have their own counters.
  WeightedSumLoss copy = loss;
  copy.set_progress(100, 0);
  EXPECT_EQ(copy(tiny_pred(), tiny_batch()).weights.at("energy"), 1.0);
  EXPECT_DOUBLE_EQ(loss.current_weights().at("energy"), 0.5);

  expect_invalid([&] { loss.set_progress(-1, 0); }, "step must be >= 0, got -1");
  expect_invalid([&] { loss.set_progress(0, -2); }, "epoch must be >= 0, got -2");
  expect_invalid([&] { loss.add(std::make_shared<StressMSELoss>(), std::shared_ptr<const LossWeightSchedule>()); },
                 "null weight schedule for 'stress'");
  expect_invalid([&] { loss.add(std::make_shared<EnergyLoss>(LossKind::MAE), std::make_shared<ConstantWeight>(1.0)); },
                 "duplicate loss term 'energy'");

  WeightedSumLoss bad;
  bad.add(std::make_shared<EnergyMSELoss>(), std::make_shared<NegativeAfter>());
  EXPECT_NO_THROW(bad(tiny_pred(), tiny_batch()));
  bad.set_progress(3, 0);
  expect_invalid([&] { bad(tiny_pred(), tiny_batch()); },
                 "scheduled weight of 'energy' must be a finite number >= 0, got -1 at step 3, epoch 0");
}

// Issue 14: a batch in which no structure has a stress (or forces, energy)
// label trains with that term at exactly 0 even though the forward skipped
// the prediction; a labelled batch without the prediction is still an error.
TEST(Losses, TermWithoutLabelsInTheBatchIsZeroWithoutItsPrediction) {
  Batch b = tiny_batch();
  b.has_stress = bvec({0, 0, 0});
  b.has_forces = bvec({0, 0, 0});
  ModelOutputs p = tiny_pred();
  at::Tensor e = p.energy.detach().clone().requires_grad_(true);
  p.energy = e;
  p.stress = at::Tensor();
  p.forces = at::Tensor();
  for (const auto& kind : {LossKind::MSE, LossKind::MAE, LossKind::Huber}) {
    const at::Tensor s = StressLoss(kind)(p, b);
    const at::Tensor f = ForcesLoss(kind, ForcesMode::Vector)(p, b);
    EXPECT_EQ(s.item<double>(), 0.0);
    EXPECT_EQ(f.item<double>(), 0.0);
    EXPECT_EQ(s.scalar_type(), at::kDouble);
    EXPECT_TRUE(s.requires_grad());  // connected to the energy's graph
  }
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyLoss>(LossKind::MSE), 1.0);
  loss.add(std::make_shared<ForcesLoss>(), 10.0);
  loss.add(std::make_shared<StressLoss>(), 100.0);
  const LossOutput out = loss(p, b);
  // Energy per atom d = (0.5, -0.5), w = (1·1, 2·0.5) → (0.25 + 0.25)/2.
  EXPECT_NEAR(out.total.item<double>(), 0.25, 1e-15);
  EXPECT_EQ(out.components.at("stress").item<double>(), 0.0);
  out.total.backward();
  EXPECT_TRUE(e.grad().defined());
  // A NaN energy of an unlabelled structure reaches neither value nor gradient.
  ModelOutputs nan_pred = p;
  nan_pred.energy = at::full({3}, std::nan(""), at::kDouble).requires_grad_(true);
  const at::Tensor z = StressLoss()(nan_pred, b);
  EXPECT_EQ(z.item<double>(), 0.0);
  z.backward();
  EXPECT_EQ(nan_pred.energy.grad().abs().sum().item<double>(), 0.0);
  // Labels present but no prediction: still the clear error.
  Batch labelled = tiny_batch();
  try {
    (void)StressLoss()(p, labelled);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("predicted stress"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace crucible
