// Contracts of TrainingStrategy (seed 002): stage order, counters, durations,
// hook registry rules, live vs detached losses, vetoed steps, restart.

#include "crucible/common/error.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"
#include "training_helpers.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::steps_options;
using testing::energy_forces_loss;
using testing::ToyModel;
using testing::toy_dataset;
using testing::toy_structures;

std::vector<TrainingStage> all_stages() {
  std::vector<TrainingStage> s;
  for (int i = 0; i < kNumTrainingStages; ++i) s.push_back(static_cast<TrainingStage>(i));
  return s;
}

/// Records every stage it sees.
class Recorder : public Hook {
 public:
  std::string name() const override { return "recorder"; }
  bool runs_on_stage(TrainingStage s) const override {
    return s != TrainingStage::DO_BACKWARD && s != TrainingStage::DO_OPTIMIZER_STEP;
  }
  void operator()(TrainContext& ctx, TrainingStage s) override {
    stages.push_back(s);
    if (s == TrainingStage::AFTER_LOSS || s == TrainingStage::BEFORE_BACKWARD ||
        s == TrainingStage::AFTER_BACKWARD || s == TrainingStage::AFTER_BATCH) {
      loss_requires_grad.push_back(ctx.loss.requires_grad());
    }
    if (s == TrainingStage::AFTER_BATCH) {
      counters.push_back({ctx.step_count, ctx.batch_count, ctx.epoch_count, ctx.epoch_step_count});
    }
  }
  void enter() override { log.push_back("enter " + tag); }
  void exit(bool failed) override { log.push_back("exit " + tag + (failed ? " failed" : "")); }
  std::vector<TrainingStage> stages;
  std::vector<bool> loss_requires_grad;
  std::vector<std::array<int64_t, 4>> counters;
  std::vector<std::string> log;
  std::string tag = "r";
};

const std::vector<TrainingStage> kBatchStages = {
    TrainingStage::BEFORE_BATCH,    TrainingStage::BEFORE_FORWARD,
    TrainingStage::AFTER_FORWARD,   TrainingStage::BEFORE_LOSS,
    TrainingStage::AFTER_LOSS,      TrainingStage::BEFORE_BACKWARD,
    TrainingStage::AFTER_BACKWARD,  TrainingStage::BEFORE_OPTIMIZER_STEP,
    TrainingStage::AFTER_OPTIMIZER_STEP, TrainingStage::AFTER_BATCH};

TEST(TrainingStrategy, StageOrderForTwoEpochsWithValidation) {
  auto ds = toy_dataset(4);
  DataLoader loader(ds, {2, true, 0, false});
  auto rec = std::make_shared<Recorder>();
  StrategyOptions o = steps_options(1);
  o.num_steps.reset();
  o.num_epochs = 2;
  o.validation = ValidationConfig{toy_dataset(2, 9), 1, 0, 16};
  TrainingStrategy strategy(ToyModel().ptr(), o, energy_forces_loss(), {rec});
  strategy.run(loader);

  std::vector<TrainingStage> expected = {TrainingStage::SETUP, TrainingStage::BEFORE_TRAINING};
  for (int epoch = 0; epoch < 2; ++epoch) {
    if (epoch > 0) {
      // BEFORE_TRAINING only once; BEFORE_EPOCH every epoch.
    }
    expected.push_back(TrainingStage::BEFORE_EPOCH);
    for (int b = 0; b < 2; ++b) expected.insert(expected.end(), kBatchStages.begin(), kBatchStages.end());
    expected.push_back(TrainingStage::AFTER_EPOCH);
    expected.push_back(TrainingStage::AFTER_VALIDATION);
  }
  expected.push_back(TrainingStage::AFTER_TRAINING);
  expected.push_back(TrainingStage::AFTER_VALIDATION);  // the validation after training
  ASSERT_EQ(rec->stages.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(stage_name(rec->stages[i]), std::string(stage_name(expected[i]))) << "at " << i;
  }
  EXPECT_EQ(strategy.step_count, 4);
  EXPECT_EQ(strategy.batch_count, 4);
  EXPECT_EQ(strategy.epoch_count, 2);
  EXPECT_EQ(strategy.epoch_step_count, 0);
  EXPECT_EQ(strategy.global_step_count, 4);
  ASSERT_TRUE(strategy.last_validation().has_value());
  EXPECT_EQ(strategy.last_validation()->num_structures, 2);
}

TEST(TrainingStrategy, LossIsLiveUntilBeforeBackwardThenDetached) {
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  auto rec = std::make_shared<Recorder>();
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {rec});
  strategy.run(loader);
  EXPECT_EQ(rec->loss_requires_grad, (std::vector<bool>{true, true, false, false}));
}

TEST(TrainingStrategy, CountersWithStepTargetMidEpoch) {
  DataLoader loader(toy_dataset(6), {2, true, 0, false});  // 3 batches per epoch
  auto rec = std::make_shared<Recorder>();
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(4), energy_forces_loss(), {rec});
  strategy.run(loader);
  EXPECT_EQ(strategy.step_count, 4);
  EXPECT_EQ(strategy.batch_count, 4);
  EXPECT_EQ(strategy.epoch_count, 1);
  EXPECT_EQ(strategy.epoch_step_count, 1);
  // Hooks see counters as updated after the step: (step, batch, epoch, epoch_step).
  ASSERT_EQ(rec->counters.size(), 4u);
  EXPECT_EQ(rec->counters[2], (std::array<int64_t, 4>{3, 3, 0, 3}));
  EXPECT_EQ(rec->counters[3], (std::array<int64_t, 4>{4, 4, 1, 1}));
}

TEST(TrainingStrategy, EpochsConvertToStepsWithModifier) {
  StrategyOptions o = steps_options(1);
  o.num_steps.reset();
  o.num_epochs = 3;
  o.epoch_step_modifier = 0.5;
  TrainingStrategy strategy(ToyModel().ptr(), o, energy_forces_loss());
  EXPECT_EQ(strategy.target_step_count(5), 8);  // ceil(3 * 5 * 0.5)
  EXPECT_THROW(strategy.target_step_count(0), std::invalid_argument);
}

TEST(TrainingStrategy, RejectsBothOrNeitherDuration) {
  StrategyOptions o = steps_options(5);
  o.num_epochs = 2;
  try {
    TrainingStrategy s(ToyModel().ptr(), o, energy_forces_loss());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "exactly one of training.num_epochs or training.num_steps must be set, got both");
  }
  o.num_epochs.reset();
  o.num_steps.reset();
  try {
    TrainingStrategy s(ToyModel().ptr(), o, energy_forces_loss());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "exactly one of training.num_epochs or training.num_steps must be set, got neither");
  }
}

TEST(TrainingStrategy, RejectsBadOptimizerOptions) {
  StrategyOptions o = steps_options(1);
  o.optimizer.lr = -1;
  try {
    TrainingStrategy s(ToyModel().ptr(), o, energy_forces_loss());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "training.optimizer.lr must be a finite number > 0, got -1");
  }
  o.optimizer.lr = 1e-3;
  o.optimizer.name = "adagard";
  try {
    TrainingStrategy s(ToyModel().ptr(), o, energy_forces_loss());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "training.optimizer.name must be one of adam, adamw, sgd, rmsprop, "
                           "adagrad, got 'adagard'");
  }
}

TEST(TrainingStrategy, HooksEnteredInOrderAndExitedInReverseAlsoOnThrow) {
  std::vector<std::string> log;
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  a->tag = "a";
  b->tag = "b";
  auto thrower = std::make_shared<LambdaHook>(
      "thrower", std::set<TrainingStage>{TrainingStage::AFTER_LOSS},
      [](TrainContext&, TrainingStage) { throw std::runtime_error("boom"); });
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(),
                            {a, b, thrower});
  EXPECT_THROW(strategy.run(loader), std::runtime_error);
  EXPECT_EQ(a->log, (std::vector<std::string>{"enter a", "exit a failed"}));
  EXPECT_EQ(b->log, (std::vector<std::string>{"enter b", "exit b failed"}));
  // b exits before a: check with a shared log.
  struct Shared : Recorder {
    std::vector<std::string>* out;
    void enter() override { out->push_back("enter " + tag); }
    void exit(bool f) override { out->push_back("exit " + tag + (f ? " failed" : "")); }
  };
  auto x = std::make_shared<Shared>();
  auto y = std::make_shared<Shared>();
  x->tag = "x";
  y->tag = "y";
  x->out = y->out = &log;
  TrainingStrategy ok(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {x, y});
  ok.run(loader);
  EXPECT_EQ(log, (std::vector<std::string>{"enter x", "enter y", "exit y", "exit x"}));
}

TEST(TrainingStrategy, RejectsDuplicateHookAndSecondDoClaimant) {
  auto rec = std::make_shared<Recorder>();
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {rec});
  try {
    strategy.register_hook(rec);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "hooks must not contain duplicate hook instances, got 'recorder' twice; pass "
                 "distinct hook objects instead");
  }
  auto noop = [](TrainContext&, TrainingStage) {};
  strategy.register_hook(std::make_shared<LambdaHook>(
      "first", std::set<TrainingStage>{TrainingStage::DO_BACKWARD}, noop));
  try {
    strategy.register_hook(std::make_shared<LambdaHook>(
        "second", std::set<TrainingStage>{TrainingStage::DO_BACKWARD}, noop));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "at most one hook may claim DO_BACKWARD, got 2: first, second");
  }
  EXPECT_EQ(strategy.hooks().size(), 2u);
}

TEST(TrainingStrategy, VetoedOptimizerStepDoesNotAdvanceStepCount) {
  ToyModel model;
  auto veto = std::make_shared<LambdaHook>(
      "veto", std::set<TrainingStage>{TrainingStage::DO_OPTIMIZER_STEP},
      [](TrainContext& ctx, TrainingStage) { ctx.optimizer_step_skipped = true; });
  bool seen_skipped = false;
  auto after = std::make_shared<LambdaHook>(
      "after", std::set<TrainingStage>{TrainingStage::AFTER_OPTIMIZER_STEP},
      [&](TrainContext& ctx, TrainingStage) { seen_skipped = ctx.optimizer_step_skipped; });
  TrainingStrategy strategy(model.ptr(), steps_options(1), energy_forces_loss(), {veto, after});
  const double a_before = model->a.item<double>();
  DataLoader loader(toy_dataset(4), {2, false, 0, false});
  strategy.train_batch(loader.batch(0));
  strategy.train_batch(loader.batch(1));
  EXPECT_TRUE(seen_skipped);
  EXPECT_EQ(strategy.step_count, 0);
  EXPECT_EQ(strategy.batch_count, 2);
  EXPECT_EQ(model->a.item<double>(), a_before);
  ASSERT_TRUE(model->a.grad().defined());
}

// Issue 4 acceptance: step-cadence validation does not fire on a step that a
// hook vetoed (step_count then repeats the value that was just validated).
TEST(TrainingStrategy, StepCadenceValidationSkipsVetoedSteps) {
  ToyModel model;
  StrategyOptions o = steps_options(4);
  o.validation = ValidationConfig{toy_dataset(2, 9), 0, 2, 16};
  TrainingStrategy strategy(model.ptr(), o, energy_forces_loss());
  strategy.register_update_hook(std::make_shared<LambdaUpdateHook>(
      "veto batch 2", [](TrainContext& ctx, TrainingStage stage, bool) {
        const bool veto = stage == TrainingStage::DO_OPTIMIZER_STEP && ctx.batch_count == 2;
        return UpdateDecision{!veto, ctx.loss};
      }));
  std::vector<int64_t> validated_at;
  strategy.register_hook(std::make_shared<LambdaHook>(
      "probe", std::set<TrainingStage>{TrainingStage::AFTER_VALIDATION},
      [&](TrainContext& ctx, TrainingStage) { validated_at.push_back(ctx.step_count); }));
  DataLoader loader(toy_dataset(10), {2, false, 0, false});
  strategy.run(loader);
  EXPECT_EQ(strategy.batch_count, 5);  // one vetoed batch
  EXPECT_EQ(strategy.step_count, 4);
  // Steps 2 and 4, then the validation after training; not again after the
  // vetoed batch that left step_count at 2.
  EXPECT_EQ(validated_at, (std::vector<int64_t>{2, 4, 4}));
}

TEST(TrainingStrategy, DoBackwardOwnerRunsBackwardWithThreadedLoss) {
  ToyModel model;
  int calls = 0;
  auto owner = std::make_shared<LambdaHook>(
      "owner", std::set<TrainingStage>{TrainingStage::DO_BACKWARD},
      [&](TrainContext& ctx, TrainingStage) {
        ++calls;
        EXPECT_TRUE(ctx.loss.requires_grad());
        (ctx.loss * 0.0).backward();  // owner decides: zero gradient
      });
  TrainingStrategy strategy(model.ptr(), steps_options(1), energy_forces_loss(), {owner});
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  strategy.train_batch(loader.batch(0));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(model->a.grad().item<double>(), 0.0);
}

TEST(TrainingStrategy, HookFrequencyGatesOnStepCount) {
  std::vector<int64_t> seen;
  auto every2 = std::make_shared<LambdaHook>(
      "every2", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
      [&](TrainContext& ctx, TrainingStage) { seen.push_back(ctx.step_count); }, 2);
  DataLoader loader(toy_dataset(5), {1, false, 0, false});
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(5), energy_forces_loss(), {every2});
  strategy.run(loader);
  EXPECT_EQ(seen, (std::vector<int64_t>{2, 4}));
}

TEST(TrainingStrategy, RestartContinuesAtTheExactNextBatch) {
  auto ds = toy_dataset(7);
  auto first_atoms = [](std::vector<double>& out) {
    return std::make_shared<LambdaHook>(
        "pos", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH},
        [&out](TrainContext& ctx, TrainingStage) {
          out.push_back(ctx.batch->positions.sum().item<double>());
        });
  };
  std::vector<double> full, part;
  {
    DataLoader loader(ds, {2, true, 3, false});  // 4 batches per epoch
    TrainingStrategy s(ToyModel().ptr(), steps_options(7), energy_forces_loss(), {first_atoms(full)});
    s.run(loader);
  }
  {
    DataLoader loader(ds, {2, true, 3, false});
    TrainingStrategy s(ToyModel().ptr(), steps_options(3), energy_forces_loss(), {first_atoms(part)});
    s.run(loader);
    EXPECT_EQ(s.epoch_step_count, 3);
    TrainingStrategy resumed(ToyModel().ptr(), steps_options(7), energy_forces_loss(),
                             {first_atoms(part)});
    resumed.step_count = s.step_count;
    resumed.batch_count = s.batch_count;
    resumed.epoch_count = s.epoch_count;
    resumed.epoch_step_count = s.epoch_step_count;
    resumed.run(loader);
    EXPECT_EQ(resumed.step_count, 7);
    EXPECT_EQ(resumed.epoch_count, 1);
    EXPECT_EQ(resumed.epoch_step_count, 3);
  }
  EXPECT_EQ(part, full);
}

TEST(TrainingStrategy, InconsistentRestartCountersAreRejected) {
  DataLoader loader(toy_dataset(4), {2, true, 0, false});
  TrainingStrategy s(ToyModel().ptr(), steps_options(10), energy_forces_loss());
  s.step_count = 3;
  s.batch_count = 5;
  s.epoch_count = 1;
  s.epoch_step_count = 1;
  try {
    s.run(loader);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "restart counters are inconsistent: batch_count (or step_count when "
                 "batch_count is 0) must equal epoch_count * len(loader) + epoch_step_count = "
                 "3, got 5");
  }
}

TEST(TrainingStrategy, TrainingRecoversToyParameters) {
  ToyModel model(1.0, 1.0, 0.0);
  auto ds = toy_dataset(32, 5);
  DataLoader loader(ds, {8, true, 0, false});
  StrategyOptions o = steps_options(1);
  o.num_steps.reset();
  o.num_epochs = 150;
  o.optimizer.lr = 0.05;
  o.validation = ValidationConfig{toy_dataset(8, 77), 0, 0, 16};
  TrainingStrategy strategy(model.ptr(), o, energy_forces_loss());
  const auto before = evaluate_model(*model, *o.validation->data, at::kCPU,
                                     EvaluateOptions{16, false, at::kDouble});
  strategy.run(loader);
  const auto after = *strategy.last_validation();
  EXPECT_LT(after.forces_mae, before.forces_mae / 10);
  EXPECT_NEAR(model->a.item<double>(), 2.0, 0.1);
  EXPECT_NEAR(model->b.item<double>(), 1.5, 0.1);
}

}  // namespace
}  // namespace crucible
