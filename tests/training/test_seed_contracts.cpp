// Issue 14: contracts of the reference design (seeds 000, 001, 002) that the
// loop honours, each a test that failed before: scaler-aware non-finite
// handling, filtered gradients cleared, the lifecycle as seed 002 states it,
// and the restore checks.

#include "crucible/common/error.h"
#include "crucible/training/mixed_precision_hook.h"
#include "crucible/training/non_finite_loss.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"
#include "training_helpers.h"

#include <gtest/gtest.h>
#include <torch/serialize/output-archive.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace crucible {
namespace {

using testing::precision_options;
using testing::energy_forces_loss;
using testing::toy_dataset;
using testing::ToyModel;

constexpr float kInfF = std::numeric_limits<float>::infinity();

SchedulerConfig step_scheduler() {
  SchedulerConfig sc;
  sc.name = "step";
  sc.step_size = 1;
  sc.gamma = 0.5;
  return sc;
}

DataLoader ordered_loader(int n, int64_t batch_size = 1) {
  return DataLoader(toy_dataset(n), DataLoaderOptions{batch_size, false, 0, false});
}

/// Plants +inf into `param`'s gradient after the backward of batch `at_batch`
/// (batch_count at that moment; -1 = every batch).
std::shared_ptr<Hook> plant_inf(at::Tensor param, int64_t at_batch) {
  return std::make_shared<LambdaHook>(
      "plant_inf", std::set<TrainingStage>{TrainingStage::AFTER_BACKWARD},
      [param, at_batch](TrainContext& ctx, TrainingStage) {
        if (at_batch >= 0 && ctx.batch_count != at_batch) return;
        at::NoGradGuard g;
        param.mutable_grad().fill_(kInfF);
      });
}

bool has_guard(const TrainingStrategy& s) {
  for (const auto& h : s.registered_hooks()) {
    if (std::dynamic_pointer_cast<NonFiniteLossGuard>(h)) return true;
  }
  return false;
}

// ---------------------------------------------------------------- 1. scaler-aware non-finite handling

TEST(ScalerAwareNonFinite, RunUnder16MixedSkipsTheOverflowAndEndsNormally) {
  ToyModel model;
  StrategyOptions o = precision_options(4, "16-mixed");
  o.optimizer.scheduler = step_scheduler();
  TrainingStrategy s(model.ptr(), o, energy_forces_loss(), {plant_inf(model->a, 1)});
  std::vector<double> a_after;
  s.register_hook(std::make_shared<LambdaHook>(
      "record", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
      [&](TrainContext&, TrainingStage) { a_after.push_back(model->a.item<double>()); }));
  auto loader = ordered_loader(6);
  s.run(loader);
  EXPECT_TRUE(has_guard(s));  // the default guard is there, and let the scaler skip
  EXPECT_FALSE(s.stopped_early()) << s.stop_reason();
  EXPECT_EQ(s.stop_reason(), "");
  EXPECT_EQ(s.step_count, 4);
  EXPECT_EQ(s.batch_count, 5);  // one batch's step skipped, not counted
  EXPECT_DOUBLE_EQ(s.precision_hook()->scale(), 32768.0);  // halved once
  ASSERT_EQ(a_after.size(), 5u);
  EXPECT_EQ(a_after[1], a_after[0]);  // the overflowing step left the weights alone
  EXPECT_NE(a_after[2], a_after[1]);
  // The scheduler held at the skipped step: 4 steps of ×0.5.
  EXPECT_EQ(s.lr_schedulers().at(0)->last_step(), 4);
  EXPECT_DOUBLE_EQ(s.optimizers().at(0)->param_groups().at(0).options().get_lr(), 0.01 / 16.0);
}

TEST(ScalerAwareNonFinite, OnlyTheOverflowingOptimizersSchedulerHolds) {
  ToyModel model;
  StrategyOptions o = precision_options(10, "16-mixed");
  OptimizerConfig first;  // owns "a"
  first.name = "sgd";
  first.lr = 0.01;
  first.params = "^a$";
  first.scheduler = step_scheduler();
  OptimizerConfig second = first;  // owns "b" and "c"
  second.params = "^(b|c)$";
  o.optimizer_configs["main"] = {first, second};
  TrainingStrategy s(model.ptr(), o, energy_forces_loss(), {plant_inf(model->b, 1)});
  auto ds = toy_dataset(3);
  s.train_batch(ds->collate({0}));
  const double a1 = model->a.item<double>(), b1 = model->b.item<double>();
  s.train_batch(ds->collate({1}));  // b's gradient overflows
  EXPECT_NE(model->a.item<double>(), a1);  // the first optimizer stepped
  EXPECT_EQ(model->b.item<double>(), b1);  // the second did not
  EXPECT_EQ(s.step_count, 1);              // a skipped optimizer step is not counted
  EXPECT_EQ(s.lr_schedulers().at(0)->last_step(), 2);
  EXPECT_EQ(s.lr_schedulers().at(1)->last_step(), 1);  // held
  EXPECT_DOUBLE_EQ(s.precision_hook()->scale(), 32768.0);
  EXPECT_EQ(s.stop_reason(), "");
  s.train_batch(ds->collate({2}));
  EXPECT_EQ(s.step_count, 2);
  EXPECT_EQ(s.lr_schedulers().at(1)->last_step(), 2);
}

TEST(ScalerAwareNonFinite, StopsOnceTheScaleFallsBelowTheFloor) {
  ToyModel model;
  GradScalerOptions g;
  g.init_scale = 1.0;  // 2^-14 = 6.1e-5 < 1e-4 after 14 overflows
  TrainingStrategy s(model.ptr(), precision_options(100), energy_forces_loss(),
                     {std::make_shared<MixedPrecisionHook>("16-mixed", g), plant_inf(model->a, -1)});
  auto loader = ordered_loader(40);
  s.run(loader);
  EXPECT_TRUE(s.stopped_early());
  EXPECT_EQ(s.step_count, 0);
  EXPECT_EQ(s.batch_count, 14);
  const std::string& why = s.stop_reason();
  EXPECT_NE(why.find("overflowed 14 times in a row"), std::string::npos) << why;
  EXPECT_NE(why.find("below the floor min_loss_scale = 0.0001"), std::string::npos) << why;
  EXPECT_THROW(NonFiniteLossGuard(NonFiniteLossGuardOptions{0.0}), ConfigError);
}

TEST(ScalerAwareNonFinite, NonFiniteLossStillStopsWithAScaler) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(10, "16-mixed"), energy_forces_loss());
  s.register_hook(std::make_shared<LambdaHook>(
      "nan_weight", std::set<TrainingStage>{TrainingStage::BEFORE_FORWARD},
      [&](TrainContext& ctx, TrainingStage) {
        if (ctx.batch_count == 2) {
          at::NoGradGuard g;
          model->c.fill_(std::nan(""));
        }
      }));
  auto loader = ordered_loader(6);
  s.run(loader);
  EXPECT_TRUE(s.stopped_early());
  EXPECT_NE(s.stop_reason().find("non-finite loss"), std::string::npos) << s.stop_reason();
  EXPECT_EQ(s.step_count, 2);
}

TEST(ScalerAwareNonFinite, WithoutAScalerANonFiniteGradientStops) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(10, "32-true"), energy_forces_loss(),
                     {plant_inf(model->a, 1)});
  auto loader = ordered_loader(6);
  s.run(loader);
  EXPECT_TRUE(s.stopped_early());
  EXPECT_NE(s.stop_reason().find("non-finite gradient"), std::string::npos) << s.stop_reason();
}

// ---------------------------------------------------------------- 2. filtered gradients

TEST(FilteredGradients, TrainableParametersNoOptimizerOwnsAreClearedBeforeEachBatch) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(10), energy_forces_loss());
  s.set_optimizer_parameter_filter(std::set<std::string>{"main.a", "main.b"});
  auto ds = toy_dataset(2);
  const Batch b1 = ds->collate({1});
  std::vector<at::Tensor> c_grads;
  s.register_hook(std::make_shared<LambdaHook>(
      "c_grad", std::set<TrainingStage>{TrainingStage::AFTER_BACKWARD},
      [&](TrainContext&, TrainingStage) { c_grads.push_back(model->c.grad().clone()); }));
  s.train_batch(ds->collate({0}));
  // The gradient of batch 1 alone, at the weights batch 1 starts from.
  ToyModel probe(model->a.item<double>(), model->b.item<double>(), model->c.item<double>());
  WeightedSumLoss loss = energy_forces_loss();
  ComputeOptions co;
  co.training = true;
  loss(compute_outputs(*probe, b1, co), b1).total.backward();
  s.train_batch(b1);
  ASSERT_EQ(c_grads.size(), 2u);
  // The strategy trains in float32, the probe in float64.
  const double expected = probe->c.grad().item<double>();
  EXPECT_NEAR(c_grads[1].item<double>(), expected, 1e-5 * std::abs(expected) + 1e-7);
  EXPECT_GT(std::abs(c_grads[0].item<double>()), 1e-3);  // a real gradient was cleared
  // Nor does it land in a checkpoint: restored, c has no gradient, a has one.
  std::map<std::string, std::string> files;
  for (auto& [n, b] : s.state_files()) files[n] = b;
  ToyModel other;
  TrainingStrategy t(other.ptr(), precision_options(10), energy_forces_loss());
  t.set_optimizer_parameter_filter(std::set<std::string>{"main.a", "main.b"});
  t.train_batch(ds->collate({0}));
  t.restore_state_files(files);
  EXPECT_TRUE(other->a.grad().defined());
  EXPECT_FALSE(other->c.grad().defined());
}

// ---------------------------------------------------------------- 3. lifecycle

TEST(Lifecycle, APlainDoOptimizerStepOwnerDoesNotSuppressZeroGrad) {
  ToyModel model;
  StrategyOptions o = precision_options(10);
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  std::vector<at::Tensor> grads;
  // Owns the step but never steps: the weights stay put, so each batch's
  // gradient on the same batch must be the same, not a growing sum.
  s.register_hook(std::make_shared<LambdaHook>(
      "no_step", std::set<TrainingStage>{TrainingStage::DO_OPTIMIZER_STEP},
      [&](TrainContext& ctx, TrainingStage) {
        grads.push_back(model->a.grad().clone());
        ctx.optimizer_step_skipped = true;
      }));
  auto ds = toy_dataset(1);
  s.train_batch(ds->collate({0}));
  s.train_batch(ds->collate({0}));
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_DOUBLE_EQ(grads[1].item<double>(), grads[0].item<double>());
}

TEST(Lifecycle, TrainBatchRunsSetupHooksOnEveryCall) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(10), energy_forces_loss());
  int setups = 0;
  s.register_hook(std::make_shared<LambdaHook>(
      "count", std::set<TrainingStage>{TrainingStage::SETUP},
      [&](TrainContext&, TrainingStage) { ++setups; }));
  auto ds = toy_dataset(3);
  for (int64_t k = 0; k < 3; ++k) s.train_batch(ds->collate({k}));
  EXPECT_EQ(setups, 3);
}

TEST(Lifecycle, SetupHooksCanReplaceTheDataLoader) {
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 1;
  o.optimizer.lr = 0.01;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  DataLoader given = ordered_loader(4, 1);        // 4 batches
  DataLoader replacement = ordered_loader(6, 3);  // 2 batches of 3
  std::vector<int64_t> graphs;
  s.register_hook(std::make_shared<LambdaHook>(
      "swap", std::set<TrainingStage>{TrainingStage::SETUP, TrainingStage::BEFORE_BATCH},
      [&](TrainContext& ctx, TrainingStage stage) {
        if (stage == TrainingStage::SETUP) {
          EXPECT_EQ(ctx.active_dataloader, &given);
          ctx.active_dataloader = &replacement;
        } else {
          EXPECT_EQ(ctx.strategy->active_dataloader(), &replacement);
          graphs.push_back(ctx.batch->num_graphs());
        }
      }));
  s.run(given);
  EXPECT_EQ(graphs, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(s.step_count, 2);
  EXPECT_EQ(s.epoch_count, 1);
  EXPECT_EQ(s.active_dataloader(), nullptr);
}

TEST(Lifecycle, RunBuildsItsSchedulerForItsOwnHorizon) {
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 2;  // 4 batches an epoch: 8 steps
  o.optimizer.lr = 0.01;
  SchedulerConfig sc;
  sc.name = "cosine";
  sc.final_lr_factor = 0.1;
  o.optimizer.scheduler = sc;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  auto ds = toy_dataset(4);
  s.train_batch(ds->collate({0}));  // builds for train_batch's horizon
  auto loader = ordered_loader(4);
  s.run(loader);
  EXPECT_EQ(s.step_count, 8);
  // A cosine over 8 steps, built by run() at step 1, stepped 7 times.
  const double eta_min = 0.001;
  const double expected = eta_min + 0.5 * (0.01 - eta_min) * (1.0 + std::cos(M_PI * 7.0 / 8.0));
  EXPECT_NEAR(s.optimizers().at(0)->param_groups().at(0).options().get_lr(), expected, 1e-15);
}

TEST(Lifecycle, StepCadenceTakesPrecedenceOverEpochCadence) {
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 2;
  o.optimizer.lr = 0.01;
  ValidationConfig vc;
  vc.data = toy_dataset(2, 5);
  vc.every_n_epochs = 1;
  vc.every_n_steps = 3;
  o.validation = vc;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  std::vector<int64_t> at_steps;
  s.register_hook(std::make_shared<LambdaHook>(
      "validations", std::set<TrainingStage>{TrainingStage::AFTER_VALIDATION},
      [&](TrainContext& ctx, TrainingStage) { at_steps.push_back(ctx.step_count); }));
  auto loader = ordered_loader(4);
  s.run(loader);
  EXPECT_EQ(at_steps, (std::vector<int64_t>{3, 6, 8}));  // steps 3 and 6, then the final one
}

// ---------------------------------------------------------------- 4. restore checks

TEST(RestoreChecks, EpochPositionFollowsFromBatchCountWhenEpochStepCountIsZero) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(8), energy_forces_loss());
  s.step_count = 6;
  s.batch_count = 6;  // epoch_count and epoch_step_count left at 0; global_step_count too
  std::vector<int64_t> positions;
  s.register_hook(std::make_shared<LambdaHook>(
      "where", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH},
      [&](TrainContext& ctx, TrainingStage) { positions.push_back(ctx.epoch_step_count); }));
  auto loader = ordered_loader(4);
  s.run(loader);
  EXPECT_EQ(positions, (std::vector<int64_t>{2, 3}));  // epoch 1, batches 2 and 3
  EXPECT_EQ(s.epoch_count, 2);
  EXPECT_EQ(s.batch_count, 8);
  EXPECT_EQ(s.global_step_count, 8);  // 6 × world size 1, then two steps
}

TEST(RestoreChecks, NegativeCountersAreRefused) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(8), energy_forces_loss());
  s.epoch_step_count = -1;
  auto loader = ordered_loader(4);
  try {
    s.run(loader);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("epoch_step_count must be >= 0, got -1"), std::string::npos)
        << e.what();
  }

  // The same in a checkpoint's counters.pt.
  ToyModel m2;
  TrainingStrategy t(m2.ptr(), precision_options(8), energy_forces_loss());
  t.train_batch(toy_dataset(1)->collate({0}));
  std::map<std::string, std::string> files;
  for (auto& [n, b] : t.state_files()) files[n] = b;
  torch::serialize::OutputArchive archive;
  for (const char* k : {"global_step_count", "batch_count", "epoch_count", "epoch_step_count"}) {
    archive.write(k, at::scalar_tensor(int64_t{1}, at::kLong));
  }
  archive.write("step_count", at::scalar_tensor(int64_t{-3}, at::kLong));
  std::ostringstream os;
  archive.save_to(os);
  files["counters.pt"] = os.str();
  try {
    t.restore_state_files(files);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("counters.pt: 'step_count' must be >= 0, got -3"),
              std::string::npos)
        << e.what();
  }
}

std::map<std::string, std::string> files_after_one_batch(StrategyOptions o) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.train_batch(toy_dataset(1)->collate({0}));
  std::map<std::string, std::string> files;
  for (auto& [n, b] : s.state_files()) files[n] = b;
  return files;
}

TEST(RestoreChecks, MoreOrFewerOptimizerOrSchedulerStatesAreRefused) {
  StrategyOptions one = precision_options(8);
  one.optimizer.scheduler = step_scheduler();
  const auto files = files_after_one_batch(one);

  StrategyOptions two = precision_options(8);
  OptimizerConfig a, bc;
  a.params = "^a$";
  bc.params = "^(b|c)$";
  two.optimizer_configs["main"] = {a, bc};
  ToyModel m;
  TrainingStrategy s(m.ptr(), two, energy_forces_loss());
  try {
    s.restore_state_files(files);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("holds 1 optimizer state(s)"), std::string::npos) << what;
    EXPECT_NE(what.find("builds 2 (optimizer_configs.main[0], optimizer_configs.main[1])"),
              std::string::npos)
        << what;
  }
  // A scheduler state where the configuration has none, and the reverse.
  ToyModel m2;
  TrainingStrategy no_sched(m2.ptr(), precision_options(8), energy_forces_loss());
  try {
    no_sched.restore_state_files(files);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler.0.pt: the checkpoint holds a scheduler state"),
              std::string::npos)
        << e.what();
  }
  ToyModel m3;
  TrainingStrategy with_sched(m3.ptr(), one, energy_forces_loss());
  try {
    with_sched.restore_state_files(files_after_one_batch(precision_options(8)));
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler.0.pt: the configuration has a scheduler "
                                         "(training.scheduler)"),
              std::string::npos)
        << e.what();
  }
  // The matching configuration restores.
  ToyModel m4;
  TrainingStrategy same(m4.ptr(), one, energy_forces_loss());
  EXPECT_NO_THROW(same.restore_state_files(files));
}

// ---------------------------------------------------------------- 7. mixed labels

// Batches in which no structure has a stress label train and validate with
// that term at 0, in every precision mode (batch size 1 alternates between
// periodic frames with stress and molecules without).
TEST(MixedLabels, BatchesWithoutStressTrainAndValidateInEveryPrecisionMode) {
  auto data = std::make_shared<AtomicDataset>(testing::mixed_stress_structures(6), 4.0);
  for (const char* mode : {"64-true", "32-true", "bf16-mixed", "16-mixed"}) {
    SCOPED_TRACE(mode);
    ToyModel model(1.0, 1.0, 0.0);
    StrategyOptions o = precision_options(6, mode);
    ValidationConfig vc;
    vc.data = data;
    vc.batch_size = 1;
    vc.every_n_steps = 2;
    o.validation = vc;
    TrainingStrategy s(model.ptr(), o, testing::energy_forces_stress_loss());
    std::vector<double> stress_terms;
    s.register_hook(std::make_shared<LambdaHook>(
        "stress", std::set<TrainingStage>{TrainingStage::AFTER_LOSS},
        [&](TrainContext& ctx, TrainingStage) {
          stress_terms.push_back(ctx.losses->components.at("stress").item<double>());
        }));
    DataLoader loader(data, DataLoaderOptions{1, false, 0, false});
    s.run(loader);
    EXPECT_EQ(s.stop_reason(), "");
    EXPECT_EQ(s.step_count, 6);
    ASSERT_EQ(stress_terms.size(), 6u);
    for (size_t k = 0; k < 6; ++k) {
      if (k % 2 == 1) EXPECT_EQ(stress_terms[k], 0.0) << k;  // a molecule
      if (k % 2 == 0) EXPECT_GT(stress_terms[k], 0.0) << k;  // a periodic frame
    }
    ASSERT_TRUE(s.last_validation());
    EXPECT_TRUE(std::isfinite(s.last_validation()->stress_mae));
    EXPECT_EQ(s.last_validation()->num_stresses, 27);  // 3 periodic frames × 9
    EXPECT_TRUE(std::isfinite(s.last_validation()->loss));
  }
}

}  // namespace
}  // namespace crucible
