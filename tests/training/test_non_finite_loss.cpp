// NonFiniteLossGuard (issue 8): registered by the strategy unless spike
// skipping is; vetoes the step after a non-finite loss (also one from an
// earlier accumulation micro-batch) or gradient, zeroes the gradients,
// requests a stop with a reason; and the strategy's bound on batches in a
// row without a step.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "crucible/training/gradient_accumulation.h"
#include "crucible/training/non_finite_loss.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"
#include "crucible/training/update_hook.h"
#include "toy_model.h"
#include "training_helpers.h"

namespace crucible {
namespace {

using testing::energy_loss;
using testing::kNaN;
using testing::params;
using testing::steps_options;
using testing::toy_structures;
using testing::ToyModel;

/// Multiplies the loss of batch `bad` by NaN at DO_BACKWARD (so both the
/// loss the guard sees and the gradients are NaN).
std::shared_ptr<LambdaUpdateHook> poison_batch(int64_t bad) {
  return std::make_shared<LambdaUpdateHook>(
      "poison",
      [bad](TrainContext& ctx, TrainingStage s, bool) {
        if (s == TrainingStage::DO_BACKWARD && ctx.batch_count == bad) return UpdateDecision{true, ctx.loss * kNaN};
        return UpdateDecision{true, ctx.loss};
      },
      1);
}

/// One structure per batch, in order; structure `nan_energy` (if >= 0) has a
/// NaN energy label, so its batch's loss is NaN (made in process: the
/// extxyz reader refuses such labels).
DataLoader loader(int n, int nan_energy = -1) {
  auto structures = toy_structures(n, 3);
  if (nan_energy >= 0) structures[static_cast<size_t>(nan_energy)].energy = kNaN;
  return DataLoader(std::make_shared<AtomicDataset>(structures, 4.0), {1, false, 0, false});
}

template <class T>
int count_hooks(const TrainingStrategy& s) {
  int n = 0;
  for (const auto& h : s.registered_hooks()) n += dynamic_cast<T*>(h.get()) != nullptr;
  return n;
}

TEST(NonFiniteLossGuard, StopsTheRunAtTheFirstNonFiniteLossWithTheLastGoodWeights) {
  ToyModel model;
  TrainingStrategy strategy(model.ptr(), steps_options(10), energy_loss());
  DataLoader l = loader(6, 2);
  std::vector<double> before_bad;
  strategy.register_hook(std::make_shared<LambdaHook>(
      "record", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH}, [&](TrainContext& ctx, TrainingStage) {
        if (ctx.batch_count == 2) before_bad = params(model);
      }));
  strategy.run(l);
  EXPECT_EQ(count_hooks<NonFiniteLossGuard>(strategy), 1);
  EXPECT_TRUE(strategy.stopped_early());
  EXPECT_EQ(strategy.step_count, 2);  // batches 0 and 1 stepped; batch 2 did not
  EXPECT_EQ(strategy.batch_count, 3);
  EXPECT_EQ(params(model), before_bad);
  EXPECT_EQ(strategy.stop_reason(), "non-finite loss (nan) at step 2, epoch 0, batch 3 of the epoch");
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0) << "gradients must be zeroed";
  }
}

TEST(NonFiniteLossGuard, NonFiniteGradientWithAFiniteLossAlsoStops) {
  ToyModel model;
  TrainingStrategy strategy(model.ptr(), steps_options(10), energy_loss(), {poison_batch(1)});
  DataLoader l = loader(6);
  strategy.run(l);
  EXPECT_TRUE(strategy.stopped_early());
  EXPECT_EQ(strategy.step_count, 1);
  EXPECT_EQ(strategy.stop_reason(), "non-finite gradient at step 1, epoch 0, batch 2 of the epoch");
  for (double v : params(model)) EXPECT_TRUE(std::isfinite(v));
}

TEST(NonFiniteLossGuard, AllFiniteFindsOneBadValueAnywhereInEveryDtypeAndLayout) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // Extreme finite values pass: the largest float, a denormal, -0.
  at::Tensor f = at::rand({1001}, at::kFloat);
  f[3] = std::numeric_limits<float>::max();
  f[4] = std::numeric_limits<float>::denorm_min();
  f[5] = -0.0;
  const at::Tensor d = at::rand({7, 143}, at::kDouble);
  EXPECT_TRUE(all_finite({f, d, at::Tensor(), at::empty({0})}));
  // One NaN or ±Inf first, in the middle or last (the vector body and the tail).
  for (int64_t at_index : {int64_t{0}, int64_t{517}, int64_t{1000}}) {
    for (double bad : {nan, inf, -inf}) {
      at::Tensor fb = f.clone(), db = d.clone();
      fb[at_index] = bad;
      db.view({-1})[at_index] = bad;
      EXPECT_FALSE(all_finite({d, fb})) << "float32 " << bad << " at " << at_index;
      EXPECT_FALSE(all_finite({db, f})) << "float64 " << bad << " at " << at_index;
    }
  }
  // Other dtypes and non-contiguous views take the sum: the values they
  // cover count, the ones outside the view do not.
  at::Tensor h = at::ones({64}, at::kBFloat16);
  EXPECT_TRUE(all_finite({h}));
  h[10] = inf;
  EXPECT_FALSE(all_finite({h}));
  at::Tensor g = f.clone();
  g[1] = inf;  // outside every other element from 0
  EXPECT_TRUE(all_finite({g.slice(0, 0, 1001, 2)}));
  g[2] = nan;  // inside
  EXPECT_FALSE(all_finite({g.slice(0, 0, 1001, 2)}));
}

TEST(NonFiniteLossGuard, NotRegisteredWithSpikeSkippingWhichSkipsInstead) {
  ToyModel model;
  auto spike = std::make_shared<SpikeSkippingHook>();
  TrainingStrategy strategy(model.ptr(), steps_options(5), energy_loss(), {spike, poison_batch(1)});
  DataLoader l = loader(6);
  strategy.run(l);
  EXPECT_EQ(count_hooks<NonFiniteLossGuard>(strategy), 0);
  EXPECT_FALSE(strategy.stopped_early());
  EXPECT_EQ(strategy.step_count, 5);
  EXPECT_EQ(spike->skipped_steps(), 1);
  for (double v : params(model)) EXPECT_TRUE(std::isfinite(v));
}

TEST(NonFiniteLossGuard, NonFiniteMicroBatchOfAnAccumulationCycleStopsAtItsStep) {
  ToyModel model;
  // Accumulation over 3 batches: batch 0 is poisoned, the step comes at batch 2.
  TrainingStrategy strategy(model.ptr(), steps_options(4), energy_loss(),
                            {std::make_shared<GradientAccumulationHook>(3)});
  const auto initial = params(model);
  DataLoader l = loader(6, 0);
  strategy.run(l);
  EXPECT_TRUE(strategy.stopped_early());
  EXPECT_EQ(strategy.batch_count, 3);
  EXPECT_EQ(strategy.step_count, 0);
  EXPECT_EQ(params(model), initial);
  EXPECT_EQ(strategy.stop_reason().rfind("non-finite loss (nan) at step 0, epoch 0, batch 1 ", 0), 0u)
      << strategy.stop_reason();
}

TEST(NonFiniteLossGuard, OptOutLeavesTheStepToTheOptimizer) {
  ToyModel model;
  StrategyOptions o = steps_options(3);
  o.stop_on_non_finite = false;
  TrainingStrategy strategy(model.ptr(), o, energy_loss(), {poison_batch(1)});
  DataLoader l = loader(3);
  strategy.run(l);
  EXPECT_EQ(count_hooks<NonFiniteLossGuard>(strategy), 0);
  EXPECT_FALSE(strategy.stopped_early());
  EXPECT_TRUE(std::isnan(params(model)[0]));  // what the guard prevents
}

TEST(MaxBatchesWithoutStep, ARunWhoseEveryStepIsVetoedStops) {
  ToyModel model;
  StrategyOptions o = steps_options(5);
  o.max_batches_without_step = 4;
  auto veto_all = std::make_shared<LambdaUpdateHook>(
      "veto all",
      [](TrainContext& ctx, TrainingStage s, bool) {
        return UpdateDecision{s != TrainingStage::DO_OPTIMIZER_STEP, ctx.loss};
      },
      30);
  TrainingStrategy strategy(model.ptr(), o, energy_loss(), {veto_all});
  DataLoader l = loader(3);
  strategy.run(l);  // would never reach 5 steps
  EXPECT_TRUE(strategy.stopped_early());
  EXPECT_EQ(strategy.batch_count, 4);
  EXPECT_EQ(strategy.step_count, 0);
  EXPECT_EQ(strategy.stop_reason().rfind("4 batches in a row ended without an optimizer step", 0), 0u)
      << strategy.stop_reason();
}

}  // namespace
}  // namespace crucible
