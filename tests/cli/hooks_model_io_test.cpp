// In-process tests of the CLI's building blocks: the cosine LR schedule, gradient
// clipping, epoch reporting and model save/load.

#include "crucible/run/model_io.h"
#include "crucible/report/progress.h"
#include "crucible/common/error.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "crucible/training/gradient_clipping.h"
#include "crucible/training/strategy.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace crucible {
namespace {

using e2e::temp_dir;

std::vector<Structure> tial_frames(size_t n) {
  auto all = read_extxyz(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
  all.resize(std::min(n, all.size()));
  return all;
}

SchNetOptions tiny_options() {
  SchNetOptions o;
  o.hidden_channels = 8;
  o.num_filters = 8;
  o.num_interactions = 1;
  o.num_gaussians = 6;
  o.cutoff = 4.0;
  return o;
}

TEST(Hooks, ClippingRejectsANonPositiveNorm) {
  EXPECT_THROW(GradientClippingHook(GradientClippingOptions{0.0, 2.0, std::nullopt}),
               ConfigError);
}

/// Records what EpochReportHook emits.
class RecordingHook : public EpochReportHook {
 public:
  std::string name() const override { return "RecordingHook"; }

 protected:
  void report(const EpochRecord&) override {}
};

TEST(Hooks, ScheduleClipAndReportsInARealRun) {
  at::manual_seed(0);
  auto frames = tial_frames(8);
  std::vector<Structure> train(frames.begin(), frames.begin() + 6);
  std::vector<Structure> valid(frames.begin() + 6, frames.end());
  auto train_ds = std::make_shared<AtomicDataset>(train, 4.0);
  auto valid_ds = std::make_shared<AtomicDataset>(valid, 4.0);
  SchNet model(tiny_options());
  model->to(at::kDouble);

  StrategyOptions so;
  so.num_epochs = 3;
  so.dtype = at::kDouble;
  so.optimizer.lr = 1e-2;
  SchedulerConfig cosine;  // what `crucible train` configures by default
  cosine.name = "cosine";
  cosine.final_lr_factor = 0.1;
  so.optimizer.scheduler = cosine;
  ValidationConfig vc;
  vc.data = valid_ds;
  vc.every_n_epochs = 2;  // epochs 2 only; epoch 3 gets the final validation
  so.validation = vc;
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(true), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 1.0);

  const fs::path dir = temp_dir("crucible_hooks_test");
  auto rec = std::make_shared<RecordingHook>();
  auto csv = std::make_shared<MetricsCsvHook>((dir / "metrics.csv").string(),
                                              std::vector<std::string>{"energy", "forces"});
  std::ostringstream progress_text;
  auto progress = std::make_shared<ProgressHook>(progress_text, 3);
  TrainingStrategy strategy(model.ptr(), so, loss, {rec, csv, progress});
  DataLoader loader(train_ds, DataLoaderOptions{2, true, 0, false});
  const int64_t total = strategy.target_step_count(loader.size());
  ASSERT_EQ(total, 9);
  GradientClippingOptions clip;  // the canonical hook `crucible train` uses
  clip.max_norm = 1e-3;
  strategy.register_hook(std::make_shared<GradientClippingHook>(clip));
  std::vector<double> seen_lr;
  strategy.register_hook(std::make_shared<LambdaHook>(
      "lr probe", std::set<TrainingStage>{TrainingStage::BEFORE_OPTIMIZER_STEP},
      [&](TrainContext& ctx, TrainingStage) {
        seen_lr.push_back(ctx.optimizers.at(0)->param_groups().at(0).options().get_lr());
      }));
  strategy.register_hook(std::make_shared<LambdaHook>(
      "clip probe", std::set<TrainingStage>{TrainingStage::AFTER_OPTIMIZER_STEP},
      [&](TrainContext& ctx, TrainingStage) {
        // Clipping ran before the step: the gradient norm is at most 1e-3.
        double sq = 0;
        for (const auto& p : ctx.model->module().parameters()) {
          if (p.grad().defined()) sq += p.grad().square().sum().item<double>();
        }
        EXPECT_LE(std::sqrt(sq), 1e-3 * (1 + 1e-6));
      }));
  strategy.run(loader);

  ASSERT_EQ(seen_lr.size(), 9u);
  // Step s uses lr(s) = 1e-3 + ½ (1e-2 − 1e-3)(1 + cos(π s / 9)).
  for (size_t s = 0; s < seen_lr.size(); ++s) {
    const double want = 1e-3 + 0.5 * (1e-2 - 1e-3) * (1 + std::cos(M_PI * s / 9.0));
    EXPECT_NEAR(seen_lr[s], want, 1e-15) << s;
  }

  // Records: epoch 1 (no validation), epoch 2 (validated), epoch 3 (no
  // validation), then the final validation at the same step.
  const auto& r = rec->records();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].epoch, 1);
  EXPECT_FALSE(r[0].validation.has_value());
  EXPECT_EQ(r[0].structures, 6);
  EXPECT_EQ(r[0].batches, 3);
  EXPECT_EQ(r[1].epoch, 2);
  ASSERT_TRUE(r[1].validation.has_value());
  EXPECT_EQ(r[1].validation->num_structures, 2);
  EXPECT_EQ(r[2].epoch, 3);
  EXPECT_FALSE(r[2].validation.has_value());
  EXPECT_TRUE(r[3].final);
  EXPECT_EQ(r[3].step, 9);
  EXPECT_TRUE(r[3].validation.has_value());
  EXPECT_TRUE(std::isfinite(r[0].train_loss));
  EXPECT_EQ(r[0].train_components.count("forces"), 1u);

  // The CSV has the header and one row per record; validation cells empty
  // for unvalidated epochs.
  std::ifstream in(dir / "metrics.csv");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0],
            "epoch,step,elapsed_s,train_loss,train_loss_energy,train_loss_forces,"
            "valid_energy_mae,valid_energy_rmse,valid_forces_mae,valid_forces_rmse,"
            "valid_stress_mae,valid_stress_rmse,valid_zero_forces_mae");
  EXPECT_EQ(lines[1].substr(lines[1].size() - 7), ",,,,,,,");
  EXPECT_NE(lines[2].substr(lines[2].size() - 3), ",,,");

  const std::string text = progress_text.str();
  EXPECT_NE(text.find("epoch 1/3  step      3"), std::string::npos) << text;
  EXPECT_NE(text.find("F MAE"), std::string::npos) << text;
  EXPECT_NE(text.find("(final)"), std::string::npos) << text;
  fs::remove_all(dir);
}

TEST(ModelIo, SaveLoadRoundTripGivesSameEnergies) {
  at::manual_seed(1);
  auto frames = tial_frames(4);
  AtomicDataset ds(frames, 4.0);
  SchNet model(tiny_options());
  model->to(at::kDouble);
  at::Tensor e0 = at::zeros({119}, at::kDouble);
  e0[13] = -3.5;
  e0[22] = -7.25;
  model->set_energy_normalization(e0, 0.7, -0.1);
  const Batch batch = ds.collate({0, 1, 2, 3});
  const at::Tensor before = model->energy(batch).detach();

  ModelMetadata meta;
  meta.dtype = "float64";
  meta.atomic_numbers = {13, 22};
  meta.e0 = {{13, -3.5}, {22, -7.25}};
  meta.scale = 0.7;
  meta.shift = -0.1;
  meta.data.energy_unit = UnitSetting{"kcal/mol", *named_unit_factor(UnitQuantity::kEnergy, "kcal/mol")};
  meta.data.forces_key = "force";
  const fs::path dir = temp_dir("crucible_model_io_test");
  save_model(dir.string(), *model, meta);
  EXPECT_TRUE(fs::exists(dir / "model.pt"));
  EXPECT_TRUE(fs::exists(dir / "model.json"));
  EXPECT_FALSE(fs::exists(dir / "model.pt.tmp"));

  LoadedModel loaded = load_model(dir.string());
  EXPECT_EQ(loaded.meta.model_type, "schnet");
  EXPECT_EQ(loaded.meta.hyperparameters.at("hidden_channels"), 8);
  EXPECT_EQ(loaded.model->name(), "schnet");
  EXPECT_EQ(loaded.meta.dtype, "float64");
  EXPECT_EQ(loaded.meta.atomic_numbers, (std::vector<int64_t>{13, 22}));
  EXPECT_EQ(loaded.meta.data.energy_unit, meta.data.energy_unit);
  EXPECT_EQ(loaded.meta.data.forces_key, "force");
  EXPECT_DOUBLE_EQ(loaded.meta.e0.at(22), -7.25);
  const at::Tensor after = loaded.model->energy(batch).detach();
  EXPECT_TRUE(at::allclose(before, after, 0, 0)) << before << after;

  // Hyperparameters that do not match the weights are a DataError.
  ASSERT_TRUE(e2e::replace_in_file(dir / "model.json", "\"hidden_channels\": 8", "\"hidden_channels\": 9"));
  EXPECT_THROW(load_model(dir.string()), DataError);
  std::ofstream(dir / "model.json") << "{ not json";
  EXPECT_THROW(load_model(dir.string()), DataError);
  EXPECT_THROW(load_model((dir / "missing").string()), DataError);
  fs::remove_all(dir);
}

// Issue 16: model.json names the registered type; a MACE model comes back
// from its hyperparameters with the same energies, and its element list.
TEST(ModelIo, MaceRoundTripThroughTheRegistry) {
  at::manual_seed(2);
  auto frames = tial_frames(3);
  AtomicDataset ds(frames, 4.0);
  MaceOptions o;
  o.hidden_irreps = "4x0e+4x1o";
  o.radial_mlp = {8};
  o.cutoff = 4.0;
  o.avg_num_neighbors = 12.5;
  o.atomic_numbers = {13, 22};
  Mace model(o);
  model->to(at::kDouble);
  at::Tensor e0 = at::zeros({119}, at::kDouble);
  e0[13] = -3.5;
  e0[22] = -7.25;
  model->set_energy_normalization(e0, 0.7, -0.1);
  const Batch batch = ds.collate({0, 1, 2});
  const at::Tensor before = model->energy(batch).detach();
  ModelMetadata meta;
  meta.model_type = "mace";
  meta.dtype = "float64";
  meta.atomic_numbers = {13, 22};
  const fs::path dir = temp_dir("crucible_model_io_mace");
  save_model(dir.string(), *model, meta);
  LoadedModel loaded = load_model(dir.string());
  EXPECT_EQ(loaded.model->name(), "mace");
  EXPECT_EQ(loaded.meta.hyperparameters.at("hidden_irreps"), "4x0e+4x1o");
  EXPECT_DOUBLE_EQ(loaded.meta.hyperparameters.at("avg_num_neighbors").get<double>(), 12.5);
  EXPECT_EQ(loaded.model->elements(), (std::vector<int64_t>{13, 22}));
  const at::Tensor after = loaded.model->energy(batch).detach();
  EXPECT_TRUE(at::allclose(before, after, 0, 0)) << before << after;
  // An unknown type names the registered ones.
  ASSERT_TRUE(e2e::replace_in_file(dir / "model.json", "\"model_type\": \"mace\"", "\"model_type\": \"nequ\""));
  try {
    load_model(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("model.type must be one of schnet, mace, got 'nequ'"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace crucible
