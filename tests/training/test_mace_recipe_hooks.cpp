// The pieces of MACE's training recipe (issue 46 deliverables 5 and 6), on
// the toy model: LrScheduler::hold and StageTwoHook (the lr of stage two),
// BestModelHook (best weights, the stage-two restart, patience and
// TrainingStrategy::request_finish), and EmaHook's torch_ema warmup. Oracles:
// the recurrences of torch_ema and mace/tools/train.py written out here, and
// evaluate_model on the saved weights.

#include "crucible/common/error.h"
#include "crucible/training/best_model.h"
#include "crucible/training/ema.h"
#include "crucible/training/lr_scheduler.h"
#include "crucible/training/stage_two.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::ToyModel;
using testing::ToyModelImpl;
using testing::toy_dataset;

StrategyOptions options(int64_t epochs, double lr = 0.05) {
  StrategyOptions o;
  o.num_epochs = epochs;
  o.dtype = at::kDouble;
  o.optimizer.lr = lr;
  return o;
}

double lr_of(const torch::optim::Optimizer& opt) {
  return opt.param_groups().at(0).options().get_lr();
}

TEST(LrSchedulerHold, HeldLrSurvivesStepsMetricsAndARestore) {
  at::Tensor p = at::zeros({1}).requires_grad_(true);
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  SchedulerConfig cosine;
  cosine.name = "cosine";
  cosine.t_max = 10;
  auto s = make_lr_scheduler(cosine, opt, 10);
  s->step();
  s->step();
  EXPECT_LT(lr_of(opt), 0.1);
  s->hold(0.003);
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.003);
  for (int k = 0; k < 5; ++k) s->step();
  EXPECT_EQ(s->last_step(), 7);  // still counts
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.003);
  const auto state = s->state_dict();
  ASSERT_EQ(state.count("held_lr"), 1u);

  torch::optim::SGD opt2({p}, torch::optim::SGDOptions(0.1));
  auto restored = make_lr_scheduler(cosine, opt2, 10);
  restored->load_state_dict(state);
  EXPECT_DOUBLE_EQ(lr_of(opt2), 0.003);
  ASSERT_TRUE(restored->held_lr().has_value());
  restored->step();
  EXPECT_DOUBLE_EQ(lr_of(opt2), 0.003);

  // A plateau schedule no longer reads its metric once held.
  SchedulerConfig plateau;
  plateau.name = "plateau";
  plateau.plateau.patience = 0;
  plateau.plateau.factor = 0.5;
  torch::optim::SGD opt3({p}, torch::optim::SGDOptions(0.1));
  auto pl = make_lr_scheduler(plateau, opt3, 10);
  pl->step(1.0);
  pl->step(2.0);  // worse: halves
  EXPECT_DOUBLE_EQ(lr_of(opt3), 0.05);
  pl->hold(0.001);
  pl->step(3.0);
  pl->step(4.0);
  EXPECT_DOUBLE_EQ(lr_of(opt3), 0.001);
  EXPECT_THROW(pl->hold(0.0), std::invalid_argument);
}

TEST(StageTwoHook, HoldsTheLrFromItsEpochOnAndTheScheduleStops) {
  ToyModel model(1.0, 1.0, 0.0);
  StrategyOptions o = options(4, 0.05);
  SchedulerConfig sc;
  sc.name = "exponential";
  sc.gamma = 0.5;
  o.optimizer.scheduler = sc;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.register_hook(std::make_shared<StageTwoHook>(StageTwoOptions{2, 0.001}));
  std::vector<double> lr_used;  // at each optimizer step
  s.register_hook(std::make_shared<LambdaHook>(
      "lr", std::set<TrainingStage>{TrainingStage::BEFORE_OPTIMIZER_STEP},
      [&](TrainContext& ctx, TrainingStage) { lr_used.push_back(lr_of(*ctx.optimizers[0])); }));
  DataLoader loader(toy_dataset(4), {2, false, 0, false});  // 2 steps per epoch
  s.run(loader);
  // Epochs 0 and 1: 0.05 halved after every step; epochs 2 and 3: held.
  EXPECT_EQ(lr_used, (std::vector<double>{0.05, 0.025, 0.0125, 0.00625, 0.001, 0.001, 0.001, 0.001}));
  EXPECT_THROW(StageTwoHook(StageTwoOptions{-1, 0.001}), ConfigError);
  EXPECT_THROW(StageTwoHook(StageTwoOptions{1, 0.0}), ConfigError);
}

/// Feeds BestModelHook a sequence of validation losses as the strategy would.
struct BestDriver {
  ToyModel model{1.0, 1.0, 0.0};
  TrainContext ctx;
  ValidationSummary v;
  BestDriver() {
    ctx.model = model.ptr().get();
    ctx.validation = &v;
  }
  void validate(BestModelHook& h, double loss, int64_t epoch, double a) {
    {
      at::NoGradGuard g;
      model->a.fill_(a);  // the weights of this validation
    }
    v.loss = loss;
    ctx.epoch_count = epoch;
    ctx.step_count = 10 * epoch;
    h(ctx, TrainingStage::AFTER_VALIDATION);
  }
};

TEST(BestModelHook, KeepsTheLowestValidationAndRestartsAtStageTwo) {
  BestModelHook h(BestModelOptions{"loss", 0, 3});
  BestDriver d;
  EXPECT_FALSE(h.has_best());
  d.validate(h, 5.0, 1, 1.5);
  d.validate(h, 2.0, 2, 2.5);  // best of stage one
  d.validate(h, std::nan(""), 2, 9.0);  // NaN never improves
  d.validate(h, 3.0, 3, 3.5);  // first stage-two validation: the best restarts
  d.validate(h, 4.0, 4, 4.5);
  EXPECT_TRUE(h.has_best());
  EXPECT_DOUBLE_EQ(h.best(), 3.0);  // not 2.0: stage-one losses are not comparable
  EXPECT_EQ(h.best_epoch(), 3);
  EXPECT_EQ(h.best_step(), 30);
  EXPECT_EQ(h.num_bad_validations(), 1);
  ToyModel target(0.0, 0.0, 0.0);
  h.copy_best_into(*target);
  EXPECT_DOUBLE_EQ(target->a.item<double>(), 3.5);

  // The state round trip keeps all of it.
  BestModelHook restored(BestModelOptions{"loss", 0, 3});
  restored.load_hook_state(h.hook_state());
  EXPECT_DOUBLE_EQ(restored.best(), 3.0);
  EXPECT_EQ(restored.best_epoch(), 3);
  d.validate(restored, 3.5, 5, 5.5);  // no second restart
  EXPECT_DOUBLE_EQ(restored.best(), 3.0);
  EXPECT_EQ(restored.num_bad_validations(), 2);

  EXPECT_THROW(BestModelHook(BestModelOptions{"force_mae", 0, {}}), ConfigError);
  EXPECT_THROW(BestModelHook(BestModelOptions{"loss", -1, {}}), ConfigError);
  BestModelHook empty;
  EXPECT_THROW(empty.copy_best_into(*target), std::logic_error);
}

TEST(BestModelHook, PatienceFinishesTheRunWithItsEndStageAndAResumeTrainsNoFurther) {
  ToyModel model(1.0, 1.0, 0.0);
  StrategyOptions o = options(30, 0.05);
  o.validation = ValidationConfig{toy_dataset(4, 9), 1, 0, 16};
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  // A validation loss that cannot improve after the first validation: a
  // hook before BestModelHook overwrites it with a constant (the strategy's
  // last validation is a mutable object, only handed out as const).
  auto best = std::make_shared<BestModelHook>(BestModelOptions{"val/loss", 3, {}});
  std::vector<std::string> stages;
  s.register_hook(std::make_shared<LambdaHook>(
      "constant loss", std::set<TrainingStage>{TrainingStage::AFTER_VALIDATION},
      [](TrainContext& ctx, TrainingStage) {
        const_cast<ValidationSummary*>(ctx.validation)->loss = 1.0;  // never improves after the first
      }));
  s.register_hook(best);
  s.register_hook(std::make_shared<LambdaHook>(
      "stages", std::set<TrainingStage>{TrainingStage::AFTER_TRAINING},
      [&](TrainContext&, TrainingStage) { stages.push_back("AFTER_TRAINING"); }));
  DataLoader loader(toy_dataset(4), {2, false, 0, false});
  s.run(loader);
  // Validation 1 sets the best; validations 2, 3, 4 do not improve: the
  // run finishes after epoch 4, with its end stage, not stopped.
  EXPECT_EQ(s.epoch_count, 4);
  EXPECT_EQ(s.step_count, 8);
  EXPECT_EQ(s.finished_early_at_step(), 8);
  EXPECT_FALSE(s.stopped_early());
  EXPECT_EQ(stages, std::vector<std::string>{"AFTER_TRAINING"});
  EXPECT_NE(s.finish_reason().find("early stopping: 3 validations without a lower val/loss"),
            std::string::npos)
      << s.finish_reason();

  // A strategy restored from its state does not train further.
  const auto files = s.state_files();
  ToyModel model2(1.0, 1.0, 0.0);
  TrainingStrategy s2(model2.ptr(), o, energy_forces_loss());
  s2.register_hook(std::make_shared<BestModelHook>(BestModelOptions{"val/loss", 3, {}}));
  std::map<std::string, std::string> file_map(files.begin(), files.end());
  s2.restore_state_files(file_map);
  EXPECT_EQ(s2.finished_early_at_step(), 8);
  s2.run(loader);
  EXPECT_EQ(s2.step_count, 8);
}

TEST(EmaWarmup, FollowsTorchEmaUseNumUpdates) {
  // torch_ema ExponentialMovingAverage(use_num_updates=True): update k uses
  // d_k = min(decay, (1 + k)/(10 + k)); the average starts at the weights
  // after the first update (EmaOptions::warmup).
  ToyModel model(0.0, 0.0, 0.0);
  EmaOptions eo{0.9, 1, 0};
  eo.warmup = true;
  eo.publish_inference_model = false;
  EmaHook ema(eo);
  const std::vector<double> weights = {1.0, 3.0, -2.0, 5.0, 0.5, 4.0};
  double expected = 0.0;
  for (size_t k = 1; k <= weights.size(); ++k) {
    {
      at::NoGradGuard g;
      model->a.fill_(weights[k - 1]);
    }
    ema.update(*model);
    const double d = std::min(0.9, (1.0 + k) / (10.0 + k));
    expected = k == 1 ? weights[0] : d * expected + (1.0 - d) * weights[k - 1];
  }
  ToyModel out(0.0, 0.0, 0.0);
  ema.copy_to(*out);
  EXPECT_NEAR(out->a.item<double>(), expected, 1e-15);
  // Without warmup the constant decay gives another value.
  EmaHook plain(EmaOptions{0.9, 1, 0});
  for (double w : weights) {
    {
      at::NoGradGuard g;
      model->a.fill_(w);
    }
    plain.update(*model);
  }
  ToyModel out2(0.0, 0.0, 0.0);
  plain.copy_to(*out2);
  EXPECT_GT(std::abs(out2->a.item<double>() - expected), 0.1);
}

}  // namespace
}  // namespace crucible
