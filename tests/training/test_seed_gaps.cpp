// Issue 49: seed contracts a user porting seed hooks hits first, each a
// test that failed before the fix: the context after the batch (seed 002),
// a callable scheduler metric (seed 002), set_inference_model's key and
// device (seed 002), a plugin given through a registered
// MixedPrecisionHook (seed 004), a plugin's own checkpointed state (seed
// 004), tensor_init_context (seed 004), the orchestrator's reverse close
// (seed 001), and a restored optimizer state applied once.

#include "crucible/common/error.h"
#include "crucible/training/mixed_precision_hook.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"

#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <map>
#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::toy_dataset;
using testing::ToyModel;

DataLoader seeded_loader(int n, uint64_t seed = 1) {
  return DataLoader(toy_dataset(n, seed), DataLoaderOptions{1, false, 0, false});
}

ValidationConfig every_epoch(int n = 2) {
  ValidationConfig vc;
  vc.data = toy_dataset(n, 7);
  vc.every_n_epochs = 1;
  return vc;
}

/// Adam's step counter of the first parameter of `opt` (0 before any step).
int64_t adam_step(torch::optim::Optimizer& opt) {
  const at::Tensor& p = opt.param_groups().at(0).params().at(0);
  auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
  if (it == opt.state().end()) return 0;
  return static_cast<torch::optim::AdamParamState&>(*it->second).step();
}

// ------------------------------------------------- the context after the batch

TEST(SeedGaps, AfterEpochValidationAndTrainingSeeTheLastBatchAndItsDetachedLoss) {
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 2;
  o.optimizer.lr = 0.01;
  o.validation = every_epoch();
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  double last_loss = 0;
  at::Tensor last_positions;
  std::map<TrainingStage, int> seen;
  s.register_hook(std::make_shared<LambdaHook>(
      "last batch", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
      [&](TrainContext& ctx, TrainingStage) {
        last_loss = ctx.loss.item<double>();
        last_positions = ctx.batch->positions.clone();
      }));
  s.register_hook(std::make_shared<LambdaHook>(
      "after", std::set<TrainingStage>{TrainingStage::AFTER_EPOCH, TrainingStage::AFTER_VALIDATION,
                                       TrainingStage::AFTER_TRAINING},
      [&](TrainContext& ctx, TrainingStage stage) {
        ++seen[stage];
        ASSERT_NE(ctx.batch, nullptr) << stage_name(stage);
        ASSERT_TRUE(ctx.loss.defined()) << stage_name(stage);
        EXPECT_FALSE(ctx.loss.requires_grad()) << stage_name(stage);
        EXPECT_EQ(ctx.loss.item<double>(), last_loss) << stage_name(stage);
        EXPECT_TRUE(ctx.batch->positions.equal(last_positions)) << stage_name(stage);
        ASSERT_NE(ctx.losses, nullptr);
        EXPECT_EQ(ctx.losses->components.count("forces"), 1u);
      }));
  auto loader = seeded_loader(3);
  s.run(loader);
  EXPECT_EQ(s.step_count, 6);
  // Two epochs, a validation after each and the final one, the end stage.
  EXPECT_EQ(seen[TrainingStage::AFTER_EPOCH], 2);
  EXPECT_EQ(seen[TrainingStage::AFTER_VALIDATION], 3);
  EXPECT_EQ(seen[TrainingStage::AFTER_TRAINING], 1);
}

// ------------------------------------------------- callable scheduler metric

TEST(SeedGaps, ACallableMetricAdapterDrivesThePlateauScheduler) {
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 3;
  o.optimizer.lr = 0.01;
  SchedulerConfig sc;
  sc.name = "plateau";
  sc.plateau.patience = 0;
  sc.plateau.factor = 0.5;
  o.optimizer.scheduler = sc;
  // Worse at every validation: 1, 2, 3, ... (the summary's own metrics
  // would improve as the toy model trains).
  std::vector<int64_t> sizes;
  o.optimizer.scheduler_metric = [&sizes](const ValidationSummary& v) {
    sizes.push_back(v.num_structures);
    return static_cast<double>(sizes.size());
  };
  o.validation = every_epoch(2);
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  auto loader = seeded_loader(2);
  s.run(loader);
  // Three epoch validations and the final one; the first sets the best,
  // each later one halves the lr.
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_DOUBLE_EQ(s.optimizers().at(0)->param_groups().at(0).options().get_lr(), 0.01 * 0.125);
  // A spec cannot hold a callable: refused, not dropped.
  EXPECT_THROW((void)s.to_spec(), ConfigError);
}

// ------------------------------------------------- set_inference_model

TEST(SeedGaps, ASingleModelStrategyIgnoresTheInferenceModelKey) {
  ToyModel model;
  StrategyOptions o;
  o.num_steps = 1;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  auto copy = model->clone_model();
  EXPECT_NO_THROW(s.set_inference_model(copy, "ema"));  // seed 002: the key is ignored
  EXPECT_EQ(s.inference_model(), copy);
  s.set_inference_model(nullptr, "anything");
  EXPECT_EQ(s.inference_model(), nullptr);
  // The published copy is on the training device (CPU here; a CUDA build
  // moves a CPU copy to the GPU the same way).
  s.set_inference_model(copy);
  EXPECT_EQ(copy->module().parameters().at(0).device(), o.device);
}

TEST(SeedGaps, ANamedModelStrategyStillNeedsAKnownKey) {
  ToyModel student, teacher;
  std::map<std::string, std::shared_ptr<EnergyModel>> models{{"student", student.ptr()},
                                                              {"teacher", teacher.ptr()}};
  StrategyOptions o;
  o.num_steps = 1;
  o.optimizer_configs["student"] = {OptimizerConfig{}};
  TrainingStrategy s(models, o, energy_forces_loss());
  EXPECT_THROW(s.set_inference_model(student->clone_model(), "ema"), ConfigError);
  EXPECT_NO_THROW(s.set_inference_model(student->clone_model(), "student"));
}

// ------------------------------------------------- plugins (seed 004)

/// A 32-true plugin in float32 that counts its conversions and optimizer
/// steps, and checkpoints its step count as its own state.
class CountingPlugin : public PrecisionPlugin {
 public:
  CountingPlugin() : PrecisionPlugin(PrecisionMode::k32True) {}
  at::ScalarType param_dtype() const override { return at::kFloat; }
  at::ScalarType input_dtype() const override { return at::kFloat; }
  void convert_module(torch::nn::Module& module) const override {
    ++calls["convert_module"];
    PrecisionPlugin::convert_module(module);
  }
  Batch convert_input(const Batch& batch, at::Device device) const override {
    ++calls["convert_input"];
    return PrecisionPlugin::convert_input(batch, device);
  }
  ModelOutputs convert_output(const ModelOutputs& outputs) const override {
    ++calls["convert_output"];
    return PrecisionPlugin::convert_output(outputs);
  }
  bool optimizer_step(torch::optim::Optimizer& optimizer) override {
    ++steps;
    return PrecisionPlugin::optimizer_step(optimizer);
  }
  std::unique_ptr<DefaultDtypeGuard> tensor_init_context() const override {
    ++calls["tensor_init_context"];
    return PrecisionPlugin::tensor_init_context();
  }
  std::map<std::string, double> state_dict() const override {
    auto state = PrecisionPlugin::state_dict();
    state["counting.steps"] = static_cast<double>(steps);
    return state;
  }
  void load_state_dict(const std::map<std::string, double>& state) override {
    steps = static_cast<int64_t>(state.at("counting.steps"));
  }
  mutable std::map<std::string, int> calls;
  int64_t steps = 0;
};

TEST(SeedGaps, APluginGivenThroughARegisteredHookConvertsModelsInputsAndOutputs) {
  for (bool via_constructor : {true, false}) {
    ToyModel model;  // float64 parameters
    StrategyOptions o;
    o.num_steps = 2;
    o.dtype = at::kDouble;  // without the plugin the run stays float64
    auto plugin = std::make_shared<CountingPlugin>();
    auto hook = std::make_shared<MixedPrecisionHook>(plugin);
    std::vector<std::shared_ptr<Hook>> hooks;
    if (via_constructor) hooks.push_back(hook);
    TrainingStrategy s(model.ptr(), o, energy_forces_loss(), hooks);
    if (!via_constructor) s.register_hook(hook);
    EXPECT_EQ(model->a.scalar_type(), at::kFloat) << via_constructor;
    EXPECT_EQ(plugin->calls["convert_module"], 1) << via_constructor;
    EXPECT_EQ(s.precision_plugin(), plugin.get());
    at::ScalarType positions = at::kByte;
    s.register_hook(std::make_shared<LambdaHook>(
        "dtype", std::set<TrainingStage>{TrainingStage::BEFORE_FORWARD},
        [&](TrainContext& ctx, TrainingStage) { positions = ctx.batch->positions.scalar_type(); }));
    auto loader = seeded_loader(2);
    s.run(loader);
    EXPECT_EQ(positions, at::kFloat);
    EXPECT_EQ(plugin->calls["convert_input"], 2);
    EXPECT_EQ(plugin->calls["convert_output"], 2);
    EXPECT_EQ(plugin->steps, 2);
  }
}

TEST(SeedGaps, AUserPluginCheckpointsItsOwnState) {
  auto make = [](std::shared_ptr<CountingPlugin> plugin, ToyModel& model) {
    StrategyOptions o;
    o.num_steps = 5;
    return std::make_unique<TrainingStrategy>(model.ptr(), o, energy_forces_loss(),
                                              std::vector<std::shared_ptr<Hook>>{
                                                  std::make_shared<MixedPrecisionHook>(plugin)});
  };
  ToyModel model;
  auto plugin = std::make_shared<CountingPlugin>();
  auto s = make(plugin, model);
  auto ds = toy_dataset(3);
  for (int64_t k = 0; k < 3; ++k) s->train_batch(ds->collate({k}));
  ASSERT_EQ(plugin->steps, 3);
  std::map<std::string, std::string> files;
  for (auto& [name, bytes] : s->state_files()) files[name] = bytes;

  ToyModel fresh_model;
  auto fresh = std::make_shared<CountingPlugin>();
  auto restored = make(fresh, fresh_model);
  restored->restore_state_files(files);
  EXPECT_EQ(fresh->steps, 3);
}

TEST(SeedGaps, ModuleInitContextEntersTheOverridableTensorInitContext) {
  CountingPlugin plugin;
  {
    auto guard = plugin.module_init_context();
    EXPECT_EQ(at::zeros({1}).scalar_type(), at::kFloat);
  }
  EXPECT_EQ(plugin.calls["tensor_init_context"], 1);
}

// ------------------------------------------------- the orchestrator's close

/// An update hook that records when it is closed.
class ClosingHook : public TrainingUpdateHook {
 public:
  ClosingHook(std::string name, int priority, std::vector<std::string>* log)
      : name_(std::move(name)), priority_(priority), log_(log) {}
  std::string name() const override { return name_; }
  int priority() const override { return priority_; }
  void close() override { log_->push_back(name_); }

 private:
  std::string name_;
  int priority_;
  std::vector<std::string>* log_;
};

TEST(SeedGaps, TheOrchestratorClosesItsChildrenInReverseOrder) {
  std::vector<std::string> log;
  ToyModel model;
  StrategyOptions o;
  o.num_steps = 1;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss(),
                     {std::make_shared<ClosingHook>("first", 10, &log),
                      std::make_shared<ClosingHook>("second", 20, &log),
                      std::make_shared<ClosingHook>("third", 30, &log)});
  s.close();
  EXPECT_EQ(log, (std::vector<std::string>{"third", "second", "first"}));
  s.close();  // idempotent
  EXPECT_EQ(log.size(), 3u);
}

// ------------------------------------------------- restored optimizer state, once

/// A checkpoint of one Adam step (state_files of a strategy trained with
/// train_batch on a 2-epoch recipe).
std::map<std::string, std::string> one_step_checkpoint() {
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 2;
  o.optimizer.lr = 0.01;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.train_batch(toy_dataset(3)->collate({0}));
  std::map<std::string, std::string> files;
  for (auto& [name, bytes] : s.state_files()) files[name] = bytes;
  return files;
}

/// Records Adam's step count at the first BEFORE_BATCH of each run().
std::shared_ptr<Hook> first_batch_adam_step(std::vector<int64_t>* out) {
  auto armed = std::make_shared<bool>(false);
  return std::make_shared<LambdaHook>(
      "adam step", std::set<TrainingStage>{TrainingStage::SETUP, TrainingStage::BEFORE_BATCH},
      [out, armed](TrainContext& ctx, TrainingStage stage) {
        if (stage == TrainingStage::SETUP) {
          *armed = true;
        } else if (*armed) {
          out->push_back(adam_step(*ctx.optimizers.at(0)));
          *armed = false;
        }
      });
}

TEST(SeedGaps, ARestoreThenTrainBatchThenRunKeepsTheLiveOptimizerState) {
  const auto files = one_step_checkpoint();
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 2;
  o.optimizer.lr = 0.01;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.restore_state_files(files);
  s.train_batch(toy_dataset(3)->collate({1}));  // Adam step 2
  ASSERT_EQ(adam_step(*s.optimizers().at(0)), 2);
  std::vector<int64_t> at_run;
  s.register_hook(first_batch_adam_step(&at_run));
  auto loader = seeded_loader(3);
  s.run(loader);  // rebuilds the optimizers for its horizon
  // The rebuilt Adam continues from step 2, not from the checkpoint's 1.
  EXPECT_EQ(at_run, (std::vector<int64_t>{2}));
  EXPECT_EQ(adam_step(*s.optimizers().at(0)), s.step_count);
}

TEST(SeedGaps, ARestoreThenTwoRunsOfOtherLengthsKeepTheLiveOptimizerState) {
  const auto files = one_step_checkpoint();
  ToyModel model;
  StrategyOptions o;
  o.num_epochs = 4;
  o.optimizer.lr = 0.01;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.restore_state_files(files);  // step 1, the second batch of epoch 0 next
  std::vector<int64_t> at_run;
  s.register_hook(first_batch_adam_step(&at_run));
  s.register_hook(std::make_shared<LambdaHook>(
      "stop at step 2", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
      [&s](TrainContext& ctx, TrainingStage) {
        if (ctx.step_count == 2) s.request_stop();
      }));
  auto a = seeded_loader(2);
  s.run(a);  // 4 epochs of 2 batches (an 8-step horizon), stopped at step 2, an epoch's end
  ASSERT_EQ(s.step_count, 2);
  ASSERT_TRUE(s.stopped_early());
  auto b = seeded_loader(1);
  s.run(b);  // 4 epochs of 1 batch: rebuilt for 4 steps
  EXPECT_EQ(s.step_count, 4);
  // run(a) built its Adam from the checkpoint (step 1); run(b)'s rebuilt
  // one continues from step 2, not from the checkpoint's 1.
  EXPECT_EQ(at_run, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(adam_step(*s.optimizers().at(0)), 4);
}

}  // namespace
}  // namespace crucible
