// The strategy's learning-rate schedulers and EMA inference model (issue 3,
// seeds 001 and 002): per-step schedulers step once per optimizer step that
// ran (never on an accumulation batch), a metric-driven scheduler only after
// each scheduled validation with the monitored metric, and validation
// evaluates the EMA model an EmaHook publishes when use_ema is set.

#include "crucible/common/error.h"
#include "crucible/training/ema.h"
#include "crucible/training/gradient_accumulation.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::ToyModel;
using testing::ToyModelImpl;
using testing::toy_dataset;

StrategyOptions epochs_options(int64_t epochs) {
  StrategyOptions o;
  o.num_epochs = epochs;
  o.dtype = at::kDouble;
  o.optimizer.lr = 0.01;
  return o;
}

double lr_of(TrainingStrategy& s) {
  return s.optimizers().at(0)->param_groups().at(0).options().get_lr();
}

TEST(StrategySchedulers, PerStepSchedulerStepsOnlyWhenTheOptimizerStepped) {
  for (bool accumulate : {false, true}) {
    ToyModel model;
    StrategyOptions o = epochs_options(1);
    SchedulerConfig sc;
    sc.name = "exponential";
    sc.gamma = 0.5;
    o.optimizer.scheduler = sc;
    if (accumulate) o.epoch_step_modifier = 0.5;  // 4 batches = 2 optimizer steps
    TrainingStrategy s(model.ptr(), o, energy_forces_loss());
    if (accumulate) s.register_hook(std::make_shared<GradientAccumulationHook>(2));
    std::vector<double> lr_used;  // lr at each BEFORE_OPTIMIZER_STEP
    s.register_hook(std::make_shared<LambdaHook>(
        "lr", std::set<TrainingStage>{TrainingStage::BEFORE_OPTIMIZER_STEP},
        [&](TrainContext& ctx, TrainingStage) {
          lr_used.push_back(ctx.optimizers[0]->param_groups()[0].options().get_lr());
          ASSERT_EQ(ctx.lr_schedulers.size(), 1u);
          ASSERT_NE(ctx.lr_schedulers[0], nullptr);
        }));
    DataLoader loader(toy_dataset(8), {2, false, 0, false});
    s.run(loader);
    if (!accumulate) {
      EXPECT_EQ(s.step_count, 4);
      EXPECT_EQ(lr_used, (std::vector<double>{0.01, 0.005, 0.0025, 0.00125}));
      EXPECT_DOUBLE_EQ(lr_of(s), 0.000625);
    } else {
      EXPECT_EQ(s.step_count, 2);
      EXPECT_EQ(s.batch_count, 4);
      // The accumulation batch (vetoed step) did not advance the schedule.
      EXPECT_EQ(lr_used, (std::vector<double>{0.01, 0.01, 0.005, 0.005}));
      EXPECT_DOUBLE_EQ(lr_of(s), 0.0025);
    }
    EXPECT_EQ(s.lr_schedulers().at(0)->last_step(), s.step_count);
  }
}

TEST(StrategySchedulers, PlateauStepsAfterEachScheduledValidationWithItsMetric) {
  ToyModel model(1.0, 1.0, 0.0);
  StrategyOptions o = epochs_options(4);
  o.optimizer.lr = 0.05;
  o.validation = ValidationConfig{toy_dataset(4, 9), 1, 0, 16};
  SchedulerConfig sc;
  sc.name = "plateau";
  sc.plateau.monitor = "val/forces_mae";
  sc.plateau.patience = 0;
  sc.plateau.threshold = 0.0;
  sc.plateau.factor = 0.5;
  o.optimizer.scheduler = sc;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  // An update orchestrator is present: it must not step the metric-driven scheduler.
  s.register_update_hook(std::make_shared<LambdaUpdateHook>(
      "noop", [](TrainContext& ctx, TrainingStage, bool) { return UpdateDecision{true, ctx.loss}; }));
  std::vector<double> metrics, lr_at_validation;
  s.register_hook(std::make_shared<LambdaHook>(
      "probe", std::set<TrainingStage>{TrainingStage::AFTER_VALIDATION},
      [&](TrainContext& ctx, TrainingStage) {
        metrics.push_back(ctx.validation->forces_mae);
        lr_at_validation.push_back(ctx.optimizers[0]->param_groups()[0].options().get_lr());
      }));
  DataLoader loader(toy_dataset(8), {4, true, 0, false});
  s.run(loader);
  ASSERT_EQ(metrics.size(), 5u);  // 4 epochs + the validation after training
  EXPECT_EQ(s.lr_schedulers().at(0)->last_step(), 5);
  // Replay PyTorch's rule independently: patience 0 halves on every
  // validation that does not improve on the best so far.
  double best = std::numeric_limits<double>::infinity(), lr = 0.05;
  for (size_t k = 0; k < metrics.size(); ++k) {
    EXPECT_DOUBLE_EQ(lr_at_validation[k], lr) << k;  // stepped after the hooks saw it
    if (metrics[k] < best) {
      best = metrics[k];
    } else {
      lr *= 0.5;
    }
  }
  EXPECT_DOUBLE_EQ(lr_of(s), lr);
  EXPECT_LT(lr, 0.05);  // the final validation repeats the last metric: a plateau
}

TEST(StrategySchedulers, BadSchedulerConfigFailsAtConstruction) {
  ToyModel model;
  auto message = [&](StrategyOptions o) {
    try {
      TrainingStrategy s(model.ptr(), o, energy_forces_loss());
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  StrategyOptions o = epochs_options(1);
  SchedulerConfig sc;
  sc.name = "plateau";
  o.optimizer.scheduler = sc;
  EXPECT_EQ(message(o), "training.scheduler: the plateau scheduler steps on a validation metric "
                        "and needs a validation config, got none");
  o.validation = ValidationConfig{toy_dataset(2), 1, 0, 16};
  o.optimizer.scheduler->plateau.monitor = "force_mae";
  EXPECT_EQ(message(o),
            "training.scheduler.monitor must be a validation monitor (loss, energy_mae, "
            "energy_rmse, forces_mae, forces_rmse, stress_mae, stress_rmse), optionally "
            "prefixed with val/, got 'force_mae'");
  o.optimizer.scheduler->name = "step";
  o.optimizer.scheduler->step_size = 0;
  EXPECT_EQ(message(o), "training.scheduler: `step_size` must be >= 1, got 0");
}

TEST(StrategyEma, ValidationEvaluatesThePublishedAverage) {
  for (bool use_ema : {true, false}) {
    ToyModel model(1.0, 1.0, 0.0);
    StrategyOptions o = epochs_options(3);
    o.optimizer.lr = 0.05;
    auto valid = toy_dataset(4, 9);
    o.validation = ValidationConfig{valid, 1, 0, 16, use_ema};
    TrainingStrategy s(model.ptr(), o, energy_forces_loss());
    auto ema = std::make_shared<EmaHook>(EmaOptions{0.5, 1, 0});
    s.register_update_hook(ema);
    std::vector<bool> used;
    s.register_hook(std::make_shared<LambdaHook>(
        "probe", std::set<TrainingStage>{TrainingStage::AFTER_VALIDATION},
        [&](TrainContext& ctx, TrainingStage) { used.push_back(ctx.validation->inference_model); }));
    DataLoader loader(toy_dataset(8), {2, true, 0, false});
    s.run(loader);

    auto inference = s.inference_model();
    ASSERT_NE(inference, nullptr);  // published whatever use_ema says
    EXPECT_EQ(inference, ema->inference_model());
    EXPECT_NE(inference.get(), &s.model());
    // The published copy holds exactly the shadow, and differs from the live weights.
    auto* copy = dynamic_cast<ToyModelImpl*>(inference.get());
    ASSERT_NE(copy, nullptr);
    for (const auto& [name, t] : ema->shadow_parameters()) {
      EXPECT_TRUE(copy->named_parameters()[name].equal(t)) << name;
      EXPECT_FALSE(copy->named_parameters()[name].requires_grad()) << name;
    }
    EXPECT_FALSE(copy->a.equal(model->a.detach()));
    EXPECT_EQ(used, std::vector<bool>(4, use_ema));

    const EvaluateOptions eo{16, true, at::kDouble};
    const auto on_average = evaluate_model(*inference, *valid, at::kCPU, eo);
    const auto on_live = evaluate_model(*model, *valid, at::kCPU, eo);
    const auto& last = *s.last_validation();
    const auto& expected = use_ema ? on_average : on_live;
    EXPECT_DOUBLE_EQ(last.forces_mae, expected.forces_mae);
    EXPECT_DOUBLE_EQ(last.energy_mae, expected.energy_mae);
    EXPECT_NE(on_average.forces_mae, on_live.forces_mae);
  }
}

/// A toy model that cannot be copied (EnergyModel's default clone_model).
class UncopyableToy : public ToyModelImpl {
 public:
  std::shared_ptr<EnergyModel> clone_model() const override { return nullptr; }
};

TEST(StrategyEma, PublishingNeedsACopyableModelOrIsSwitchedOff) {
  auto model = std::make_shared<UncopyableToy>();
  StrategyOptions o = epochs_options(1);
  TrainingStrategy s(model, o, energy_forces_loss());
  s.register_update_hook(std::make_shared<EmaHook>(EmaOptions{0.5, 1, 0}));
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  try {
    s.run(loader);
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("model 'toy' does not implement "
                                         "EnergyModel::clone_model()"),
              std::string::npos)
        << e.what();
  }
  auto model2 = std::make_shared<UncopyableToy>();
  TrainingStrategy s2(model2, o, energy_forces_loss());
  EmaOptions eo{0.5, 1, 0};
  eo.publish_inference_model = false;
  auto ema = std::make_shared<EmaHook>(eo);
  s2.register_update_hook(ema);
  s2.run(loader);
  EXPECT_EQ(s2.inference_model(), nullptr);
  EXPECT_EQ(ema->num_updates(), 1);
}

}  // namespace
}  // namespace crucible
