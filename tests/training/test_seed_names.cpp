// Issue 14: seed 002's entry points under recognisable names: register_hook
// with a stage, close(), to_spec / from_spec, save_checkpoint /
// restore_checkpoint / load_checkpoint, default_training_fn, the training
// loss in validation, set_inference_model with a model name.

#include "crucible/common/error.h"
#include "crucible/training/strategy.h"
#include "crucible/training/strategy_spec.h"
#include "toy_model.h"
#include "training_helpers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace crucible {
namespace {

using testing::precision_options;

namespace fs = std::filesystem;
using testing::energy_forces_loss;
using testing::toy_dataset;
using testing::ToyModel;

TEST(SeedNames, RegisterHookWithAStageRunsItThereOnly) {
  ToyModel model;
  TrainingStrategy s(model.ptr(), precision_options(10), energy_forces_loss());
  std::vector<TrainingStage> seen;
  auto hook = std::make_shared<LambdaHook>(
      "both", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH, TrainingStage::AFTER_BATCH},
      [&](TrainContext&, TrainingStage stage) { seen.push_back(stage); });
  s.register_hook(hook, TrainingStage::AFTER_BATCH);
  s.train_batch(toy_dataset(1)->collate({0}));
  EXPECT_EQ(seen, std::vector<TrainingStage>{TrainingStage::AFTER_BATCH});
  EXPECT_EQ(std::count_if(s.hooks().begin(), s.hooks().end(),
                          [](const auto& h) { return h->name() == "both"; }),
            1);
  auto update = std::make_shared<LambdaUpdateHook>(
      "u", [](TrainContext& ctx, TrainingStage, bool) { return UpdateDecision{true, ctx.loss}; });
  EXPECT_THROW(s.register_hook(update, TrainingStage::AFTER_BATCH), ConfigError);
}

class ClosingStageHook : public Hook {
 public:
  explicit ClosingStageHook(int* closes) : closes_(closes) {}
  std::string name() const override { return "closing"; }
  bool runs_on_stage(TrainingStage) const override { return false; }
  void operator()(TrainContext&, TrainingStage) override {}
  void close() override { ++*closes_; }

 private:
  int* closes_;
};

TEST(SeedNames, CloseClosesEveryHookOnceAndTearsThePluginDown) {
  ToyModel model;
  StrategyOptions o = precision_options(10);
  o.precision = "16-mixed";
  int closes = 0;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss(), {std::make_shared<ClosingStageHook>(&closes)});
  s.train_batch(toy_dataset(1)->collate({0}));
  ASSERT_NE(s.precision_hook()->scaler(), nullptr);
  s.close();
  s.close();
  EXPECT_EQ(closes, 1);
  EXPECT_EQ(s.precision_hook()->scaler(), nullptr);           // torn down
  EXPECT_DOUBLE_EQ(s.precision_hook()->scale(), 65536.0);     // its state kept
  // A later batch builds a new scaler from the kept state.
  EXPECT_NO_THROW(s.train_batch(toy_dataset(1)->collate({0})));
  ASSERT_NE(s.precision_hook()->scaler(), nullptr);
  EXPECT_EQ(s.precision_hook()->state_dict().at("_growth_tracker"), 2.0);
}

StrategyOptions rich_options() {
  StrategyOptions o;
  o.num_epochs = 3;
  o.epoch_step_modifier = 0.5;
  OptimizerConfig a;
  a.name = "sgd";
  a.lr = 0.1;
  a.momentum = 0.9;
  a.params = "^a$";
  SchedulerConfig sc;
  sc.name = "cosine";
  sc.final_lr_factor = 0.2;
  sc.warmup.steps = 2;
  sc.warmup.start_factor = 0.3;
  a.scheduler = sc;
  OptimizerConfig bc;
  bc.name = "adam";
  bc.lr = 0.01;
  bc.amsgrad = true;
  bc.param_groups.push_back({"^c$", {{"lr", 0.001}}});
  o.optimizer_configs["main"] = {a, bc};
  o.dtype = at::kDouble;
  ValidationConfig vc;
  vc.data = toy_dataset(2, 9);
  vc.every_n_epochs = 2;
  vc.batch_size = 5;
  vc.use_ema = false;
  vc.use_mixed_precision = ValidationPrecision::kNever;
  vc.compute_loss = false;
  o.validation = vc;
  o.stop_on_non_finite = false;
  o.max_batches_without_step = 17;
  o.bucket_cap_mb = 3.5;
  return o;
}

TEST(SeedNames, ToSpecFromSpecRoundTrips) {
  ToyModel model;
  const StrategyOptions o = rich_options();
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  const std::string spec = s.to_spec();
  StrategyOptions runtime;
  runtime.validation = ValidationConfig{};
  runtime.validation->data = toy_dataset(2, 9);
  auto rebuilt = TrainingStrategy::from_spec(spec, {{"main", ToyModel().ptr()}}, energy_forces_loss(),
                                             {}, {}, runtime);
  EXPECT_EQ(rebuilt->to_spec(), spec);
  const StrategyOptions& r = rebuilt->options();
  EXPECT_EQ(r.num_epochs, 3);
  EXPECT_FALSE(r.num_steps.has_value());
  EXPECT_EQ(r.optimizer_configs.at("main").at(0).scheduler->warmup.steps, 2);
  EXPECT_EQ(r.optimizer_configs.at("main").at(1).param_groups.at(0).options.at("lr"), 0.001);
  EXPECT_EQ(r.optimizer_configs.at("main").at(1).amsgrad, std::optional<bool>(true));
  EXPECT_FALSE(r.optimizer_configs.at("main").at(1).momentum.has_value());
  EXPECT_EQ(r.validation->every_n_epochs, 2);
  EXPECT_EQ(r.validation->use_mixed_precision, ValidationPrecision::kNever);
  EXPECT_EQ(r.dtype, at::kDouble);
  EXPECT_EQ(r.max_batches_without_step, 17);

  // Unknown keys and wrong types name the key path.
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    try {
      (void)strategy_options_from_spec(text, runtime);
      FAIL() << "expected ConfigError for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::string unknown = spec;
  unknown.replace(unknown.find("\"params\": \"^a$\""), 15, "\"params\": \"^a$\", \"parms\": 1");
  expect_error(unknown, "spec.optimizer_configs.main[0].parms: unknown key");
  std::string wrong = spec;
  wrong.replace(wrong.find("\"max_batches_without_step\": 17"), 30, "\"max_batches_without_step\": \"17\"");
  expect_error(wrong, "spec.max_batches_without_step: expected an integer, got \"17\"");
  expect_error("{", "spec: must be JSON");
}

TEST(SeedNames, SaveRestoreAndLoadCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("crucible_seed_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto ds = toy_dataset(3);
  ToyModel model;
  StrategyOptions o = precision_options(10);
  o.optimizer.scheduler = SchedulerConfig{};
  o.optimizer.scheduler->name = "step";
  o.optimizer.scheduler->gamma = 0.5;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.train_batch(ds->collate({0}));
  s.train_batch(ds->collate({1}));
  EXPECT_EQ(s.save_checkpoint(dir.string()), 0);

  // restore_checkpoint into a constructed strategy.
  ToyModel other(5.0, 5.0, 5.0);
  TrainingStrategy t(other.ptr(), o, energy_forces_loss());
  EXPECT_EQ(t.restore_checkpoint(dir.string()), 0);
  EXPECT_EQ(t.step_count, 2);
  EXPECT_TRUE(other->a.equal(model->a));

  // load_checkpoint: the strategy rebuilt from strategy.json plus runtime pieces.
  ToyModel third(7.0, 7.0, 7.0);
  auto loaded = TrainingStrategy::load_checkpoint(dir.string(), {{"main", third.ptr()}},
                                                  energy_forces_loss());
  EXPECT_EQ(loaded->step_count, 2);
  EXPECT_EQ(loaded->to_spec(), s.to_spec());
  EXPECT_TRUE(third->b.equal(model->b));
  s.train_batch(ds->collate({2}));
  loaded->train_batch(ds->collate({2}));
  EXPECT_TRUE(third->a.equal(model->a));  // the continuation is exact
  EXPECT_EQ(loaded->optimizers().at(0)->param_groups().at(0).options().get_lr(),
            s.optimizers().at(0)->param_groups().at(0).options().get_lr());
  fs::remove_all(dir);
}

TEST(SeedNames, DefaultTrainingFunctionComputesWhatTheLabelsNeed) {
  ToyModel model;
  model->to(at::kDouble);
  const Batch b = toy_dataset(2)->collate({0, 1});  // molecules: no stress labels
  const ModelOutputs out = default_training_fn(*model, b);
  ASSERT_TRUE(out.energy.defined());
  ASSERT_TRUE(out.forces.defined());
  EXPECT_FALSE(out.stress.defined());
  EXPECT_TRUE(out.forces.requires_grad());  // create_graph: forces can train
  EXPECT_EQ(out.forces.sizes(), b.positions.sizes());
  EXPECT_FALSE(default_training_fn(*model, b, /*forces=*/false).forces.defined());
}

TEST(SeedNames, ValidationEvaluatesTheTrainingLoss) {
  ToyModel model;
  StrategyOptions o = precision_options(10);
  o.dtype = at::kDouble;
  ValidationConfig vc;
  vc.data = toy_dataset(3, 11);
  vc.batch_size = 1;
  o.validation = vc;
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  const ValidationSummary v = s.validate();
  // Independent: the loss of each structure on its own, averaged (one
  // structure a batch, so every batch weighs 1).
  WeightedSumLoss loss = energy_forces_loss();
  double total = 0.0, forces = 0.0;
  for (int64_t i = 0; i < 3; ++i) {
    const Batch b = vc.data->collate({i}).to(at::kCPU, at::kDouble);
    ComputeOptions co;
    const LossOutput lo = loss(compute_outputs(*model, b, co), b);
    total += lo.total.item<double>() / 3.0;
    forces += lo.components.at("forces").item<double>() / 3.0;
  }
  EXPECT_NEAR(v.loss, total, 1e-12 * total);
  EXPECT_NEAR(v.loss_components.at("forces"), forces, 1e-12 * forces);
  o.validation->compute_loss = false;
  TrainingStrategy off(ToyModel().ptr(), o, energy_forces_loss());
  EXPECT_TRUE(std::isnan(off.validate().loss));
}

TEST(SeedNames, SetInferenceModelTakesAModelName) {
  StrategyOptions o = precision_options(10);
  o.optimizer_configs["main"] = {OptimizerConfig{}};
  TrainingStrategy s({{"main", ToyModel().ptr()}, {"teacher", ToyModel().ptr()}}, o,
                     energy_forces_loss());
  auto copy = ToyModel().ptr();
  s.set_inference_model(copy, "teacher");
  EXPECT_EQ(s.inference_model("teacher"), copy);
  EXPECT_EQ(s.inference_model(), nullptr);  // the primary model ("main") has none
  s.set_inference_model(copy);
  EXPECT_EQ(s.inference_model(), copy);
  EXPECT_EQ(s.inference_model("main"), copy);
  EXPECT_THROW(s.set_inference_model(copy, "student"), ConfigError);
}

}  // namespace
}  // namespace crucible
