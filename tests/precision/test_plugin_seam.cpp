// Issue 14 / seed 004: the precision plugin is the training loop's one seam.
// A plugin that records its calls shows the order over one batch, one
// validation and teardown; a user's own plugin object changes the model
// dtype; convert_input can never lower the geometry below float32;
// MixedPrecisionHook takes seed 000's dtype spellings.

#include "crucible/common/error.h"
#include "crucible/training/mixed_precision_hook.h"
#include "crucible/training/strategy.h"
#include "training/toy_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::toy_dataset;
using testing::ToyModel;

/// Forwards to PrecisionPlugin and logs every seed-004 call by name.
class RecordingPlugin : public PrecisionPlugin {
 public:
  RecordingPlugin(std::vector<std::string>* log, PrecisionMode mode, at::ScalarType param,
                  at::ScalarType input)
      : PrecisionPlugin(mode), log_(log), param_(param), input_(input) {}
  at::ScalarType param_dtype() const override { return param_; }
  at::ScalarType input_dtype() const override { return input_; }
  void convert_module(torch::nn::Module& module) const override {
    log_->push_back("convert_module");
    PrecisionPlugin::convert_module(module);
  }
  Batch convert_input(const Batch& batch, at::Device device) const override {
    log_->push_back("convert_input");
    return PrecisionPlugin::convert_input(batch, device);
  }
  ModelOutputs convert_output(const ModelOutputs& outputs) const override {
    log_->push_back("convert_output");
    return PrecisionPlugin::convert_output(outputs);
  }
  std::unique_ptr<AutocastGuard> forward_context(at::Device device) const override {
    log_->push_back("forward_context");
    return PrecisionPlugin::forward_context(device);
  }
  at::Tensor pre_backward(const at::Tensor& loss) override {
    log_->push_back("pre_backward");
    return PrecisionPlugin::pre_backward(loss);
  }
  void backward(const at::Tensor& loss, const std::vector<at::Tensor>& parameters) override {
    log_->push_back("backward");
    PrecisionPlugin::backward(loss, parameters);
  }
  void post_backward(const at::Tensor& loss) override {
    log_->push_back("post_backward");
    PrecisionPlugin::post_backward(loss);
  }
  bool optimizer_step(torch::optim::Optimizer& optimizer) override {
    log_->push_back("optimizer_step");
    return PrecisionPlugin::optimizer_step(optimizer);
  }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& optimizer) const override {
    log_->push_back("main_params");
    return PrecisionPlugin::main_params(optimizer);
  }
  void teardown() override {
    log_->push_back("teardown");
    PrecisionPlugin::teardown();
  }

 private:
  std::vector<std::string>* log_;
  at::ScalarType param_, input_;
};

/// Casts every float tensor of the batch to bfloat16, geometry included.
class LoweringPlugin : public PrecisionPlugin {
 public:
  LoweringPlugin() : PrecisionPlugin(PrecisionMode::k32True) {}
  Batch convert_input(const Batch& batch, at::Device device) const override {
    return batch.to(device, at::kBFloat16);
  }
};

StrategyOptions one_step(std::shared_ptr<PrecisionPlugin> plugin) {
  StrategyOptions o;
  o.num_steps = 1;
  o.optimizer.lr = 0.01;
  o.precision_plugin = std::move(plugin);
  ValidationConfig vc;
  vc.data = toy_dataset(1, 3);
  vc.every_n_epochs = 0;  // only the validation after training
  o.validation = vc;
  return o;
}

TEST(PluginSeam, CallsInSeed004OrderOverABatchAValidationAndTeardown) {
  std::vector<std::string> log;
  auto plugin = std::make_shared<RecordingPlugin>(&log, PrecisionMode::k32True, at::kFloat, at::kFloat);
  ToyModel model;
  TrainingStrategy s(model.ptr(), one_step(plugin), energy_forces_loss());
  EXPECT_EQ(log, std::vector<std::string>{"convert_module"});
  log.clear();
  DataLoader loader(toy_dataset(2), DataLoaderOptions{1, false, 0, false});
  s.run(loader);
  const std::vector<std::string> expected{
      // the batch
      "convert_input", "forward_context", "convert_output", "pre_backward", "backward",
      "post_backward",
      "main_params",  // NonFiniteLossGuard's gradient check
      "optimizer_step",
      // the validation after training
      "forward_context", "convert_input", "convert_output",
      // the end of the run
      "teardown"};
  EXPECT_EQ(log, expected);
  EXPECT_EQ(s.precision_plugin(), plugin.get());
  EXPECT_EQ(s.step_count, 1);
}

TEST(PluginSeam, AUsersPluginObjectSetsTheModelAndBatchDtype) {
  std::vector<std::string> log;
  auto plugin =
      std::make_shared<RecordingPlugin>(&log, PrecisionMode::k32True, at::kDouble, at::kDouble);
  ToyModel model;
  model->to(at::kFloat);  // a float32 model in a float32 recipe ...
  ASSERT_EQ(model->a.scalar_type(), at::kFloat);
  StrategyOptions o = one_step(plugin);
  o.dtype = at::kFloat;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  EXPECT_EQ(model->a.scalar_type(), at::kDouble);  // ... made float64 by the plugin (issue 49)
  EXPECT_EQ(log.front(), "convert_module");
  at::ScalarType seen = at::kByte;
  s.register_hook(std::make_shared<LambdaHook>(
      "dtype", std::set<TrainingStage>{TrainingStage::BEFORE_FORWARD},
      [&](TrainContext& ctx, TrainingStage) { seen = ctx.batch->positions.scalar_type(); }));
  s.train_batch(toy_dataset(1)->collate({0}));
  EXPECT_EQ(seen, at::kDouble);

  // The same plugin type in float32 turns a float64 model float32, in a
  // float64 recipe.
  std::vector<std::string> log32;
  ToyModel m32;
  ASSERT_EQ(m32->a.scalar_type(), at::kDouble);
  StrategyOptions o32 = one_step(
      std::make_shared<RecordingPlugin>(&log32, PrecisionMode::k32True, at::kFloat, at::kFloat));
  o32.dtype = at::kDouble;
  TrainingStrategy s32(m32.ptr(), o32, energy_forces_loss());
  EXPECT_EQ(m32->a.scalar_type(), at::kFloat);
  EXPECT_EQ(log32, std::vector<std::string>{"convert_module"});

  // A plugin and a mode string together are refused.
  StrategyOptions both = one_step(plugin);
  both.precision = "32-true";
  EXPECT_THROW(TrainingStrategy(ToyModel().ptr(), both, energy_forces_loss()), ConfigError);
}

TEST(PluginSeam, ConvertInputNeverLowersGeometryBelowFloat32) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), one_step(std::make_shared<LoweringPlugin>()), energy_forces_loss());
  std::vector<at::ScalarType> dtypes;
  s.register_hook(std::make_shared<LambdaHook>(
      "dtype", std::set<TrainingStage>{TrainingStage::BEFORE_FORWARD},
      [&](TrainContext& ctx, TrainingStage) {
        dtypes = {ctx.batch->positions.scalar_type(), ctx.batch->cell.scalar_type(),
                  ctx.batch->shifts.scalar_type(), ctx.batch->forces.scalar_type(),
                  ctx.batch->energy.scalar_type()};
      }));
  s.train_batch(toy_dataset(1)->collate({0}));
  // Geometry back to float32, the force labels as the plugin left them, the
  // energy labels float64 (Batch::to keeps them so; issue 48).
  EXPECT_EQ(dtypes, (std::vector<at::ScalarType>{at::kFloat, at::kFloat, at::kFloat, at::kBFloat16, at::kDouble}));
  EXPECT_EQ(s.step_count, 1);
}

TEST(PluginSeam, AMixedUserPluginIsDrivenByTheRegisteredHook) {
  std::vector<std::string> log;
  auto plugin =
      std::make_shared<RecordingPlugin>(&log, PrecisionMode::kBf16Mixed, at::kFloat, at::kFloat);
  ToyModel model;
  TrainingStrategy s(model.ptr(), one_step(plugin), energy_forces_loss());
  s.train_batch(toy_dataset(1)->collate({0}));
  ASSERT_NE(s.precision_hook(), nullptr);
  EXPECT_EQ(&s.precision_hook()->plugin(), plugin.get());
  EXPECT_EQ(s.precision_plugin(), plugin.get());
  // pre_backward once (from the hook), and the hook's forward region.
  EXPECT_EQ(std::count(log.begin(), log.end(), "pre_backward"), 1);
  EXPECT_EQ(std::count(log.begin(), log.end(), "forward_context"), 1);
}

TEST(PluginSeam, MixedPrecisionHookTakesSeed000Spellings) {
  EXPECT_EQ(MixedPrecisionHook(at::kBFloat16).mode(), PrecisionMode::kBf16Mixed);
  EXPECT_EQ(MixedPrecisionHook(at::kHalf).mode(), PrecisionMode::k16Mixed);
  EXPECT_EQ(MixedPrecisionHook(at::kFloat).mode(), PrecisionMode::k32True);
  EXPECT_THROW(MixedPrecisionHook(at::kLong), ConfigError);
  for (const char* s : {"torch.bfloat16", "bfloat16", "bf16", "BF16"}) {
    EXPECT_EQ(MixedPrecisionHook(s).mode(), PrecisionMode::kBf16Mixed) << s;
  }
  for (const char* s : {"torch.float16", "float16", "fp16"}) {
    EXPECT_EQ(MixedPrecisionHook(s).mode(), PrecisionMode::k16Mixed) << s;
  }
  for (const char* s : {"torch.float32", "float32", "fp32"}) {
    EXPECT_EQ(MixedPrecisionHook(s).mode(), PrecisionMode::k32True) << s;
  }
  EXPECT_THROW(MixedPrecisionHook(std::shared_ptr<PrecisionPlugin>()), ConfigError);
}

}  // namespace
}  // namespace crucible
