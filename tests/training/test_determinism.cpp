// Exact resume (issue 5) rests on this: on one thread, the same parameters
// and the same batch give bit-identical energies, forces and parameter
// gradients on every evaluation, whatever else the process allocated in
// between. The test cycles through batches of different sizes and, between
// evaluations, allocates tensors of random sizes: the fused loops' results
// then see many relative placements of their inputs and outputs. (A fused
// loop whose compiler-made fast and fallback versions round differently,
// chosen at run time by an overlap check on the addresses, failed this
// within 60 evaluations; ExactResume failed 1 run in 40.)

#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/losses/loss.h"
#include "crucible/models/energy_model.h"
#include "../models/small_models.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace crucible {
namespace {

struct Evaluation {
  at::Tensor energy, forces, stress;
  std::vector<at::Tensor> grads;  // empty on the inference path
};

Evaluation evaluate_once(EnergyModel& model, const Batch& batch, bool training) {
  ComputeOptions co;
  co.training = training;
  co.stress = true;
  ModelOutputs out = compute_outputs(model, batch, co);
  Evaluation e{out.energy.detach().clone(), out.forces.detach().clone(), out.stress.detach().clone(), {}};
  if (!training) return e;
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 1.0);
  const at::Tensor total = loss(out, batch).total;
  for (const at::Tensor& g : torch::autograd::grad({total}, model.module().parameters())) e.grads.push_back(g.clone());
  return e;
}

std::string differs(const at::Tensor& a, const at::Tensor& b) {
  if (a.equal(b)) return "";
  return "max |diff| " + std::to_string((a - b).abs().max().item<double>());
}

void expect_bit_identical(const std::function<std::shared_ptr<EnergyModel>()>& make, bool training) {
  at::set_num_threads(1);
  auto all = read_extxyz(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
  all.resize(10);
  const std::shared_ptr<EnergyModel> model = make();
  model->module().to(at::kFloat);
  AtomicDataset data(all, model->cutoff());
  // Batches of different sizes, so that buffers of one size are reused for another.
  const std::vector<std::vector<int64_t>> picks{{0, 3, 7}, {1}, {2, 4, 5, 6, 8, 9}, {9, 0}};
  std::vector<Batch> batches;
  std::vector<Evaluation> firsts;
  for (const auto& p : picks) {
    batches.push_back(data.collate(p).to(at::kCPU, at::kFloat));
    firsts.push_back(evaluate_once(*model, batches.back(), training));
  }
  std::mt19937 rng(5);
  std::vector<at::Tensor> other;
  const auto names = model->module().named_parameters();
  for (int rep = 0; rep < 400; ++rep) {
    if (rep % 2) other.clear();
    for (int k = 0; k < 3; ++k) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % 3000);
      other.push_back(at::full({n}, std::numeric_limits<float>::quiet_NaN(), at::kFloat));
    }
    const size_t b = rng() % batches.size();
    const Evaluation e = evaluate_once(*model, batches[b], training);
    const Evaluation& first = firsts[b];
    const std::string where = "evaluation " + std::to_string(rep) + ", batch " + std::to_string(b) + ": ";
    ASSERT_EQ(differs(e.energy, first.energy), "") << where << "energy";
    ASSERT_EQ(differs(e.forces, first.forces), "") << where << "forces";
    ASSERT_EQ(differs(e.stress, first.stress), "") << where << "stress";
    ASSERT_EQ(e.grads.size(), first.grads.size());
    for (size_t i = 0; i < e.grads.size(); ++i) {
      ASSERT_EQ(differs(e.grads[i], first.grads[i]), "") << where << "gradient of " << names[i].key();
    }
  }
}

std::shared_ptr<EnergyModel> schnet(int64_t width) {
  SchNetOptions o;
  o.hidden_channels = width;
  o.num_filters = width;
  o.num_interactions = 2;
  o.num_gaussians = 6;
  o.cutoff = 4.0;
  at::manual_seed(1);
  return SchNet(o).ptr();
}

// Width 8: a half-width vector tail in every row; 20: full vectors plus a scalar tail.
TEST(Determinism, SchNetTrainingPathIsBitIdenticalAcrossEvaluations) {
  expect_bit_identical([] { return schnet(8); }, true);
  expect_bit_identical([] { return schnet(20); }, true);
}

TEST(Determinism, SchNetInferencePathIsBitIdenticalAcrossEvaluations) {
  expect_bit_identical([] { return schnet(8); }, false);
  expect_bit_identical([] { return schnet(20); }, false);
}

TEST(Determinism, MaceTrainingPathIsBitIdenticalAcrossEvaluations) {
  expect_bit_identical([] { return testing::small_mace(4.0); }, true);
}

TEST(Determinism, MaceInferencePathIsBitIdenticalAcrossEvaluations) {
  expect_bit_identical([] { return testing::small_mace(4.0); }, false);
}

}  // namespace
}  // namespace crucible
