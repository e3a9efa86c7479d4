// MixedPrecisionHook (seed 000) and its strategy integration (issue 3):
// priority and exclusivity, the autocast region from BEFORE_BATCH to
// DO_BACKWARD, loss scaling, unscale only before a step that is not vetoed,
// the planted-inf step skip under 16-mixed, exit on exceptions, validation
// under inference autocast.

#include "crucible/common/autocast_state.h"
#include "crucible/common/error.h"
#include "crucible/training/mixed_precision_hook.h"
#include "crucible/training/non_finite_loss.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"
#include "training_helpers.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace crucible {
namespace {

using testing::precision_options;
using testing::energy_forces_loss;
using testing::ToyModel;
using testing::toy_dataset;
using testing::toy_structures;

TEST(MixedPrecisionHook, PriorityKeyAndAliases) {
  MixedPrecisionHook bf16("bf16");
  EXPECT_EQ(bf16.priority(), 20);
  EXPECT_EQ(bf16.exclusive_update_key(), std::optional<std::string>("mixed_precision"));
  EXPECT_EQ(bf16.mode(), PrecisionMode::kBf16Mixed);
  EXPECT_EQ(MixedPrecisionHook("fp16").mode(), PrecisionMode::k16Mixed);
  EXPECT_EQ(MixedPrecisionHook("float32").mode(), PrecisionMode::k32True);
  EXPECT_THROW(MixedPrecisionHook("fp8"), ConfigError);
  EXPECT_FALSE(bf16.owns_optimizer_step());
  EXPECT_DOUBLE_EQ(bf16.scale(), 1.0);
}

TEST(MixedPrecisionHook, TwoHooksAreRejected) {
  auto a = std::make_shared<MixedPrecisionHook>("bf16-mixed");
  auto b = std::make_shared<MixedPrecisionHook>("16-mixed");
  EXPECT_THROW(a + b, ConfigError);
  TrainingStrategy s(ToyModel().ptr(), precision_options(1, ""), energy_forces_loss());
  s.register_hook(a);
  try {
    s.register_hook(b);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mixed_precision"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.precision_hook(), a);
}

TEST(MixedPrecisionHook, AutocastRegionFromBeforeBatchUntilDoBackward) {
  MixedPrecisionHook hook("bf16-mixed");
  TrainContext ctx;
  auto a = at::randn({4, 4}), b = at::randn({4, 4});
  hook(ctx, TrainingStage::BEFORE_BATCH, false);
  EXPECT_EQ(ctx.precision, &hook.plugin());
  EXPECT_TRUE(hook.in_autocast_region());
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
  ctx.loss = at::ones({}, at::kFloat) * 3.0;
  UpdateDecision d = hook(ctx, TrainingStage::DO_BACKWARD, false);
  EXPECT_FALSE(hook.in_autocast_region());
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
  EXPECT_TRUE(d.loss.equal(ctx.loss));  // bf16: no scaling
  EXPECT_FALSE(hook.owns_optimizer_step());

  // exit() also leaves an open region (an exception between the stages).
  hook(ctx, TrainingStage::BEFORE_BATCH, false);
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
  hook.exit(true);
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);

  // Validation autocast (seed 000 inference_autocast); never builds a scaler.
  {
    auto inference = hook.inference_context(at::kCPU);
    EXPECT_TRUE(inference->active());
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
  EXPECT_FALSE(MixedPrecisionHook("32-true").inference_context(at::kCPU)->active());
  MixedPrecisionHook fp16("16-mixed");
  EXPECT_EQ(fp16.inference_context(at::kCPU)->active(), autocast_supported(at::kCPU, at::kHalf));
  EXPECT_EQ(fp16.scaler(), nullptr);

  // 32-true: no region at all.
  MixedPrecisionHook fp32("32-true");
  fp32(ctx, TrainingStage::BEFORE_BATCH, false);
  EXPECT_FALSE(fp32.in_autocast_region());
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
}

TEST(MixedPrecisionHook, SixteenMixedScalesAndUnscalesOnlyBeforeANonVetoedStep) {
  MixedPrecisionHook hook("16-mixed");
  torch::nn::Linear lin(3, 1);
  torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.1));
  TrainContext ctx;
  ctx.optimizers = {&opt};
  hook(ctx, TrainingStage::BEFORE_BATCH, false);
  ctx.loss = lin->forward(at::ones({2, 3})).sum();
  UpdateDecision d = hook(ctx, TrainingStage::DO_BACKWARD, false);
  EXPECT_NEAR(d.loss.item<double>(), ctx.loss.item<double>() * 65536.0,
              1e-3 * std::abs(d.loss.item<double>()));
  ASSERT_NE(hook.scaler(), nullptr);
  EXPECT_TRUE(hook.owns_optimizer_step());
  d.loss.backward();
  const at::Tensor scaled = lin->bias.grad().clone();
  EXPECT_NEAR(scaled.item<double>(), 2.0 * 65536.0, 1e-3);

  // Vetoed step (e.g. gradient accumulation): nothing is unscaled.
  hook(ctx, TrainingStage::DO_OPTIMIZER_STEP, /*will_skip=*/true);
  EXPECT_FALSE(hook.scaler()->found_inf(opt).has_value());
  EXPECT_TRUE(lin->bias.grad().equal(scaled));

  // A step that proceeds: unscaled just before it, then stepped and updated.
  hook(ctx, TrainingStage::DO_OPTIMIZER_STEP, /*will_skip=*/false);
  ASSERT_TRUE(hook.scaler()->found_inf(opt).has_value());
  EXPECT_NEAR(lin->bias.grad().item<double>(), 2.0, 1e-6);
  const at::Tensor before = lin->bias.detach().clone();
  OptimizerStepReport r = hook.step_optimizers(ctx);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_FALSE(r.skipped[0]);
  EXPECT_NEAR((before - lin->bias.detach()).item<double>(), 0.2, 1e-6);
  EXPECT_DOUBLE_EQ(hook.scale(), 65536.0);
  EXPECT_EQ(hook.state_dict().at("_growth_tracker"), 1.0);
}

// The scaler alone skips the step: no NonFiniteLossGuard is registered
// (stop_on_non_finite false), so were the skip the guard's veto instead,
// the inf step would be applied and the parameters would move (issue 49).
TEST(MixedPrecisionHook, PlantedInfSkipsExactlyThatStepAndHalvesTheScale) {
  auto ds = toy_dataset(4);
  ToyModel model;
  StrategyOptions o = precision_options(10, "16-mixed");
  o.stop_on_non_finite = false;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  EXPECT_EQ(model->a.scalar_type(), at::kFloat);  // the plugin converted the model
  const int64_t planted_batch = 2;
  s.register_hook(std::make_shared<LambdaHook>(
      "plant_inf", std::set<TrainingStage>{TrainingStage::AFTER_BACKWARD},
      [&](TrainContext& ctx, TrainingStage) {
        if (ctx.batch_count == planted_batch) {
          at::NoGradGuard g;
          model->a.mutable_grad().fill_(std::numeric_limits<float>::infinity());
        }
      }));
  std::vector<double> scales;
  std::vector<int64_t> steps;
  std::vector<at::Tensor> params;
  for (int64_t k = 0; k < 4; ++k) {
    params.push_back(model->a.detach().clone());
    s.train_batch(ds->collate({k}));
    scales.push_back(s.precision_hook()->scale());
    steps.push_back(s.step_count);
  }
  ASSERT_NE(s.precision_hook(), nullptr);  // auto-registered for 16-mixed
  for (const auto& h : s.registered_hooks()) {
    EXPECT_EQ(std::dynamic_pointer_cast<NonFiniteLossGuard>(h), nullptr) << "no guard may veto";
  }
  EXPECT_EQ(s.batch_count, 4);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 2, 3}));
  EXPECT_DOUBLE_EQ(scales[0], 65536.0);
  EXPECT_DOUBLE_EQ(scales[1], 65536.0);
  EXPECT_DOUBLE_EQ(scales[2], 32768.0);  // halved by the inf step
  EXPECT_DOUBLE_EQ(scales[3], 32768.0);
  // The skipped step left the parameters untouched; the others moved them.
  EXPECT_FALSE(params[1].equal(params[0]));
  EXPECT_FALSE(model->a.detach().equal(params[3]));
  EXPECT_TRUE(params[3].equal(params[2]));
}

// Seed 001 / issue 3 acceptance: a scheduler is not stepped when a real inf
// gradient made the scaler skip its optimizer's step. No guard is
// registered (issue 49): the skip can only be the scaler's.
TEST(MixedPrecisionHook, SchedulerIsNotSteppedWhenTheScalerSkipsTheStep) {
  auto ds = toy_dataset(4);
  ToyModel model;
  StrategyOptions o = precision_options(10, "16-mixed");
  o.stop_on_non_finite = false;
  SchedulerConfig sc;
  sc.name = "step";
  sc.step_size = 1;
  sc.gamma = 0.5;
  o.optimizer.scheduler = sc;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.register_hook(std::make_shared<LambdaHook>(
      "plant_inf", std::set<TrainingStage>{TrainingStage::AFTER_BACKWARD},
      [&](TrainContext& ctx, TrainingStage) {
        if (ctx.batch_count == 1) {
          at::NoGradGuard g;
          model->a.mutable_grad().fill_(std::numeric_limits<float>::infinity());
        }
      }));
  std::vector<double> lrs;
  std::vector<int64_t> scheduler_steps;
  for (int64_t k = 0; k < 4; ++k) {
    s.train_batch(ds->collate({k}));
    lrs.push_back(s.optimizers().at(0)->param_groups().at(0).options().get_lr());
    scheduler_steps.push_back(s.lr_schedulers().at(0)->last_step());
  }
  EXPECT_EQ(s.step_count, 3);
  EXPECT_EQ(scheduler_steps, (std::vector<int64_t>{1, 1, 2, 3}));
  EXPECT_EQ(lrs, (std::vector<double>{0.005, 0.005, 0.0025, 0.00125}));
  EXPECT_DOUBLE_EQ(s.precision_hook()->scale(), 32768.0);  // the scaler did skip
  for (const auto& h : s.registered_hooks()) {
    EXPECT_EQ(std::dynamic_pointer_cast<NonFiniteLossGuard>(h), nullptr) << "no guard may veto";
  }
}

// A later hook vetoing a step whose gradients were already unscaled must
// close the scaler's iteration, so the next step unscales again (else the
// next step would apply gradients 65536x too large).
TEST(MixedPrecisionHook, VetoAfterUnscaleClosesTheScalerIteration) {
  auto ds = toy_dataset(3);
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(10, "16-mixed"), energy_forces_loss());
  s.register_hook(std::make_shared<LambdaUpdateHook>(
      "veto_second_batch",
      [](TrainContext& ctx, TrainingStage stage, bool) {
        const bool veto = stage == TrainingStage::DO_OPTIMIZER_STEP && ctx.batch_count == 1;
        return UpdateDecision{!veto, ctx.loss};
      },
      update_priority::kSpikeSkipping));
  s.train_batch(ds->collate({0}));
  s.train_batch(ds->collate({1}));  // unscaled by the hook (priority 20), then vetoed (40)
  EXPECT_EQ(s.step_count, 1);
  ASSERT_NE(s.precision_hook(), nullptr);
  for (auto* opt : s.optimizers()) {
    EXPECT_FALSE(s.precision_hook()->scaler()->found_inf(*opt).has_value());
  }
  EXPECT_EQ(s.precision_hook()->state_dict().at("_growth_tracker"), 2.0);
  const at::Tensor before = model->a.detach().clone();
  s.train_batch(ds->collate({2}));
  EXPECT_EQ(s.step_count, 2);
  // Adam moves a parameter by about lr per step when gradients are unscaled
  // and accumulated sanely; a stale scaled gradient would still be finite,
  // so also check the gradient itself is of ordinary size.
  EXPECT_LT((model->a.detach() - before).abs().item<double>(), 0.05);
  EXPECT_LT(model->a.grad().abs().item<double>(), 1e3);
}

TEST(MixedPrecisionHook, StrategyAutoRegistersForMixedModesAndSetsContextPrecision) {
  auto ds = toy_dataset(4);
  DataLoader loader(ds, {2, true, 0, false});
  ToyModel model;
  StrategyOptions o = precision_options(2, "bf16-mixed");
  ValidationConfig v;
  v.data = toy_dataset(2, 7);
  o.validation = v;
  std::vector<PrecisionPlugin*> seen;
  std::vector<bool> autocast_in_forward;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss(),
                     {std::make_shared<LambdaHook>(
                         "probe", std::set<TrainingStage>{TrainingStage::BEFORE_FORWARD},
                         [&](TrainContext& ctx, TrainingStage) {
                           seen.push_back(ctx.precision);
                           autocast_in_forward.push_back(autocast_enabled(at::kCPU));
                         })});
  EXPECT_EQ(s.precision_hook(), nullptr);
  ASSERT_NE(s.precision_plugin(), nullptr);
  EXPECT_EQ(s.batch_dtype(), at::kFloat);
  s.run(loader);
  ASSERT_NE(s.precision_hook(), nullptr);
  EXPECT_EQ(s.precision_hook()->mode(), PrecisionMode::kBf16Mixed);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], &s.precision_hook()->plugin());
  EXPECT_EQ(autocast_in_forward, (std::vector<bool>{true, true}));
  EXPECT_FALSE(autocast_enabled(at::kCPU));  // region closed after the run
  ASSERT_TRUE(s.last_validation().has_value());
  EXPECT_TRUE(std::isfinite(s.last_validation()->forces_mae));
  EXPECT_EQ(s.step_count, 2);

  // 64-true: float64 model and batches, no hook.
  ToyModel m64;
  TrainingStrategy s64(m64.ptr(), precision_options(1, "64-true"), energy_forces_loss());
  s64.train_batch(ds->collate({0}));
  EXPECT_EQ(m64->a.scalar_type(), at::kDouble);
  EXPECT_EQ(s64.precision_hook(), nullptr);
  EXPECT_EQ(s64.batch_dtype(), at::kDouble);

  // A registered hook of another mode contradicts options.precision.
  TrainingStrategy bad(ToyModel().ptr(), precision_options(1, "bf16-mixed"), energy_forces_loss(),
                       {std::make_shared<MixedPrecisionHook>("16-mixed")});
  EXPECT_THROW(bad.train_batch(ds->collate({0})), ConfigError);
  EXPECT_THROW(TrainingStrategy(ToyModel().ptr(), precision_options(1, "fp8"), energy_forces_loss()),
               ConfigError);
}

/// A toy model that records whether autocast was on in each forward.
class AutocastProbeToy : public testing::ToyModelImpl {
 public:
  at::Tensor energy(const Batch& batch) override {
    autocast_on.push_back(autocast_enabled(at::kCPU));
    return ToyModelImpl::energy(batch);
  }
  std::vector<bool> autocast_on;
};

// Seed 002 ValidationConfig.use_mixed_precision: auto follows the training
// mode's inference autocast, never turns it off, always needs a mixed mode.
TEST(MixedPrecisionHook, ValidationAutocastFollowsUseMixedPrecision) {
  for (auto mode : {ValidationPrecision::kAuto, ValidationPrecision::kAlways,
                    ValidationPrecision::kNever}) {
    auto model = std::make_shared<AutocastProbeToy>();
    StrategyOptions o = precision_options(1, "bf16-mixed");
    ValidationConfig v;
    v.data = toy_dataset(3, 7);
    v.use_mixed_precision = mode;
    o.validation = v;
    TrainingStrategy s(model, o, energy_forces_loss());
    s.train_batch(toy_dataset(1)->collate({0}));  // registers the hook
    model->autocast_on.clear();
    s.validate();
    ASSERT_FALSE(model->autocast_on.empty());
    const bool expected = mode != ValidationPrecision::kNever;
    for (bool on : model->autocast_on) EXPECT_EQ(on, expected);
  }
  StrategyOptions o = precision_options(1, "32-true");
  ValidationConfig v;
  v.data = toy_dataset(3, 7);
  v.use_mixed_precision = ValidationPrecision::kAlways;
  o.validation = v;
  try {
    TrainingStrategy s(ToyModel().ptr(), o, energy_forces_loss());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "validation.use_mixed_precision = always needs a mixed precision mode "
                           "(training.precision bf16-mixed or 16-mixed), got '32-true'");
  }
  EXPECT_EQ(parse_validation_precision("never"), ValidationPrecision::kNever);
  EXPECT_THROW(parse_validation_precision("sometimes"), ConfigError);
}

TEST(MixedPrecisionHook, RegionIsLeftWhenTheForwardThrows) {
  auto ds = toy_dataset(2);
  TrainingFn failing = [](EnergyModel&, const Batch&) -> ModelOutputs {
    EXPECT_TRUE(autocast_enabled(at::kCPU));
    throw std::runtime_error("forward failed");
  };
  TrainingStrategy s(ToyModel().ptr(), precision_options(1, "bf16-mixed"), energy_forces_loss(), {},
                     failing);
  EXPECT_THROW(s.train_batch(ds->collate({0})), std::runtime_error);
  EXPECT_FALSE(autocast_enabled(at::kCPU));
  ASSERT_NE(s.precision_hook(), nullptr);
  EXPECT_FALSE(s.precision_hook()->in_autocast_region());
}

}  // namespace
}  // namespace crucible
