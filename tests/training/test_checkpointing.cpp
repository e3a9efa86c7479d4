// CheckpointHook and save/restore_checkpoint (issue 5): checkpoints on a
// step cadence and at a signal resume exactly; a corrupted newest checkpoint
// is reported by file name and the newest intact one is used.

#include "crucible/common/error.h"
#include "crucible/training/checkpointing.h"
#include "crucible/data/dataset.h"
#include "crucible/losses/loss.h"
#include "crucible/models/mace/mace.h"
#include "toy_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::ToyModel;
using testing::toy_dataset;

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

struct ToyRun {
  ToyModel model;
  std::unique_ptr<TrainingStrategy> strategy;
  std::shared_ptr<AtomicDataset> data = toy_dataset(8);
  explicit ToyRun(double a = 1.0, double cutoff = 4.0) : model(a, 1.0, 0.0, cutoff) {
    StrategyOptions o;
    o.num_steps = 9;
    o.dtype = at::kDouble;
    o.optimizer.lr = 0.02;
    SchedulerConfig sc;
    sc.name = "cosine";
    o.optimizer.scheduler = sc;
    strategy = std::make_unique<TrainingStrategy>(model.ptr(), o, energy_forces_loss());
  }
  void run() {
    DataLoader loader(data, {2, true, 3, false});
    strategy->run(loader);
  }
};

TEST(CheckpointHook, StepCadenceCheckpointsResumeExactly) {
  ToyRun full;
  full.run();

  const fs::path dir = fresh_dir("crucible_ckpt_cadence");
  auto store = std::make_shared<checkpoint::CheckpointStore>(dir);
  ToyRun first;
  CheckpointHookOptions ho;
  ho.every_n_steps = 3;
  ho.every_n_epochs = 0;
  auto hook = std::make_shared<CheckpointHook>(store, ho);
  first.strategy->register_hook(hook);
  first.run();
  const auto entries = store->list();
  ASSERT_EQ(entries.size(), 4u);  // steps 3, 6, 9 and the end (after the final state)
  EXPECT_EQ(entries[0].counters.step_count, 3);
  EXPECT_EQ(entries[1].counters.step_count, 6);
  EXPECT_EQ(entries[2].counters.step_count, 9);
  EXPECT_EQ(entries[0].counters.extra.at("batch_count"), 3);

  // Resume from the step-3 checkpoint in a fresh strategy (other weights).
  ToyRun resumed(0.3);
  const auto r = restore_checkpoint(*store, *resumed.strategy, entries[0].index);
  EXPECT_EQ(r.index, entries[0].index);
  EXPECT_EQ(resumed.strategy->step_count, 3);
  resumed.run();
  EXPECT_TRUE(resumed.model->a.equal(full.model->a));
  EXPECT_TRUE(resumed.model->b.equal(full.model->b));
  EXPECT_TRUE(resumed.model->c.equal(full.model->c));
  fs::remove_all(dir);
}

TEST(CheckpointHook, SignalStopsAfterTheBatchWritesACheckpointAndResumes) {
  ToyRun full;
  full.run();

  const fs::path dir = fresh_dir("crucible_ckpt_signal");
  auto store = std::make_shared<checkpoint::CheckpointStore>(dir);
  ToyRun first;
  CheckpointHookOptions ho;
  ho.every_n_epochs = 0;
  ho.at_end = false;
  auto hook = std::make_shared<CheckpointHook>(store, ho);
  first.strategy->register_hook(hook);
  first.strategy->register_hook(std::make_shared<LambdaHook>(
      "sigterm at batch 5", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH},
      [](TrainContext& ctx, TrainingStage) {
        if (ctx.batch_count == 4) CheckpointHook::simulate_signal();
      }));
  first.run();
  EXPECT_TRUE(hook->signal_received());
  EXPECT_TRUE(first.strategy->stopped_early());
  EXPECT_EQ(first.strategy->batch_count, 5);  // the batch in progress was finished
  ASSERT_EQ(store->list().size(), 1u);

  ToyRun resumed(0.3);
  restore_checkpoint(*store, *resumed.strategy);
  resumed.run();
  EXPECT_TRUE(resumed.model->a.equal(full.model->a));
  EXPECT_TRUE(resumed.model->c.equal(full.model->c));
  fs::remove_all(dir);
}

TEST(CheckpointHook, CorruptedNewestCheckpointFallsBackNamingTheFile) {
  const fs::path dir = fresh_dir("crucible_ckpt_corrupt");
  auto store = std::make_shared<checkpoint::CheckpointStore>(dir);
  ToyRun first;
  CheckpointHookOptions ho;
  ho.every_n_steps = 4;
  ho.every_n_epochs = 0;
  ho.at_end = false;
  first.strategy->register_hook(std::make_shared<CheckpointHook>(store, ho));
  first.run();
  const auto entries = store->list();
  ASSERT_EQ(entries.size(), 2u);  // steps 4 and 8
  // Flip one byte of the newest checkpoint's model file.
  const fs::path victim = dir / entries[1].dir / "model.main.pt";
  ASSERT_TRUE(fs::exists(victim));
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  ToyRun resumed(0.3);
  const auto r = restore_checkpoint(*store, *resumed.strategy);
  EXPECT_EQ(r.index, entries[0].index);
  EXPECT_EQ(resumed.strategy->step_count, 4);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].index, entries[1].index);
  EXPECT_NE(r.skipped[0].message.find("model.main.pt"), std::string::npos) << r.skipped[0].message;
  // Asking for the corrupted one by index is an error naming the file.
  ToyRun other;
  try {
    restore_checkpoint(*store, *other.strategy, entries[1].index);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("model.main.pt"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(CheckpointValidators, ModelsJsonAndExtraFilesAreWritten) {
  const fs::path dir = fresh_dir("crucible_ckpt_models_json");
  checkpoint::CheckpointStore store(dir);
  ToyRun run;
  const auto entry = save_checkpoint(store, *run.strategy, -1, "", {{"recipe.json", "{\"a\": 1}"}});
  EXPECT_EQ(store.load_file(entry.index, "recipe.json"), "{\"a\": 1}");
  const auto info = nlohmann::json::parse(store.load_file(entry.index, kModelsInfoFile));
  EXPECT_EQ(info["main"]["name"], "toy");
  EXPECT_DOUBLE_EQ(info["main"]["cutoff"].get<double>(), 4.0);
  EXPECT_EQ(info["main"]["num_parameters"], 3);
  EXPECT_TRUE(info["main"]["elements"].empty());
  // A clash with a state file is refused and leaves the store as it was.
  EXPECT_THROW(save_checkpoint(store, *run.strategy, -1, "", {{"rng.pt", "x"}}),
               std::invalid_argument);
  EXPECT_EQ(store.list().size(), 1u);
  fs::remove_all(dir);
}

TEST(CheckpointValidators, SameModelsValidatorRefusesAnotherCutoffBeforeApplying) {
  const fs::path dir = fresh_dir("crucible_ckpt_validator");
  checkpoint::CheckpointStore store(dir);
  ToyRun first;
  first.run();
  save_checkpoint(store, *first.strategy);

  // Same models: accepted and applied.
  ToyRun same(0.3);
  restore_checkpoint(store, *same.strategy, std::nullopt, {same_models_validator(*same.strategy)});
  EXPECT_TRUE(same.model->a.equal(first.model->a));
  EXPECT_EQ(same.strategy->step_count, first.strategy->step_count);

  // Another cutoff: refused with both values, nothing applied.
  ToyRun wider(0.3, 5.0);
  try {
    restore_checkpoint(store, *wider.strategy, std::nullopt, {same_models_validator(*wider.strategy)});
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("models.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cutoff: checkpoint 4.0 Å, this run 5.0 Å"), std::string::npos) << msg;
  }
  EXPECT_EQ(wider.model->a.item<double>(), 0.3);
  EXPECT_EQ(wider.strategy->step_count, 0);

  // A user validator sees the loaded checkpoint (counters, files) first.
  ToyRun custom(0.3);
  int64_t seen_step = -1;
  restore_checkpoint(store, *custom.strategy, std::nullopt,
                     {[&](const LoadedCheckpoint& c) {
                       seen_step = c.entry.counters.step_count;
                       EXPECT_EQ(custom.strategy->step_count, 0);  // not applied yet
                       EXPECT_EQ(c.files.count("counters.pt"), 1u);
                     }});
  EXPECT_EQ(seen_step, first.strategy->step_count);
  fs::remove_all(dir);
}

// Issue 16: a registered model's hyperparameters are in models.json; two
// MACE models with equal kind, cutoff, elements and parameter count but
// another avg_num_neighbors are told apart by name.
TEST(CheckpointValidators, SameModelsValidatorComparesRegisteredHyperparameters) {
  const fs::path dir = fresh_dir("crucible_ckpt_mace_hparams");
  checkpoint::CheckpointStore store(dir);
  auto make = [](double avg) {
    MaceOptions o;
    o.hidden_irreps = "2x0e+2x1o";
    o.max_ell = 1;
    o.correlation = 2;
    o.num_interactions = 1;
    o.radial_mlp = {4};
    o.readout_mlp = 2;
    o.avg_num_neighbors = avg;
    o.atomic_numbers = {13};
    StrategyOptions so;
    so.num_steps = 1;
    WeightedSumLoss loss;
    loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
    return std::make_unique<TrainingStrategy>(std::make_shared<MaceImpl>(o), so, std::move(loss));
  };
  // One training batch builds the optimizer (a checkpoint holds its state).
  Structure s;
  s.positions = at::tensor({0.0, 0.0, 0.0, 1.9, 2.1, 0.2}, at::kDouble).view({2, 3});
  s.atomic_numbers = at::tensor({int64_t{13}, int64_t{13}}, at::kLong);
  s.cell = at::eye(3, at::kDouble) * 4.0;
  s.pbc = {true, true, true};
  s.energy = -7.5;
  AtomicDataset ds({s}, 5.0);
  auto first = make(10.0);
  first->train_batch(ds.collate({0}));
  save_checkpoint(store, *first);
  const auto info = nlohmann::json::parse(store.load_file(store.list().back().index, kModelsInfoFile));
  EXPECT_EQ(info["main"]["hyperparameters"]["hidden_irreps"], "2x0e+2x1o");
  auto same = make(10.0);
  EXPECT_NO_THROW(restore_checkpoint(store, *same, std::nullopt, {same_models_validator(*same)}));
  auto other = make(12.0);
  try {
    restore_checkpoint(store, *other, std::nullopt, {same_models_validator(*other)});
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("avg_num_neighbors: checkpoint 10.0, this run 12.0"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// Issue 15: checkpoints that verify but cannot be used fall back to the
// next older one: an optimizer archive that does not decode, manifest
// counters that disagree with counters.pt; a symlink inside the store is
// never followed.
TEST(CheckpointRestore, UnusableNewestFallsBackToTheOlderCheckpoint) {
  const fs::path dir = fresh_dir("crucible_ckpt_fallback");
  checkpoint::CheckpointStore store(dir);
  ToyRun first;
  first.run();
  const auto good = save_checkpoint(store, *first.strategy);
  // A newest checkpoint whose optimizer archive is garbage with a valid SHA-256.
  {
    std::vector<checkpoint::CheckpointFile> files;
    for (auto& [name, bytes] : first.strategy->state_files()) {
      files.push_back(checkpoint::CheckpointFile::from_bytes(
          name, name == "optimizer.0.pt" ? std::string("PK\x03\x04 not an archive") : bytes));
    }
    checkpoint::CheckpointCounters c;
    c.step_count = first.strategy->step_count;
    c.epoch_count = first.strategy->epoch_count;
    store.save(-1, c, files);
  }
  ToyRun resumed(0.3);
  auto r = restore_checkpoint(store, *resumed.strategy);
  EXPECT_EQ(r.index, good.index);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].message.find("optimizer.0.pt"), std::string::npos) << r.skipped[0].message;
  EXPECT_TRUE(resumed.model->a.equal(first.model->a));

  // Manifest counters that disagree with counters.pt.
  const fs::path dir2 = fresh_dir("crucible_ckpt_counters");
  checkpoint::CheckpointStore store2(dir2);
  const auto older = save_checkpoint(store2, *first.strategy);
  const auto newer = save_checkpoint(store2, *first.strategy);
  {
    std::ifstream in(dir2 / "manifest.json");
    nlohmann::json m = nlohmann::json::parse(in);
    for (auto& e : m.at("checkpoints")) {
      if (e.at("index") == newer.index) e.at("step_count") = 4;
    }
    std::ofstream(dir2 / "manifest.json") << m.dump(1);
  }
  ToyRun again(0.3);
  r = restore_checkpoint(store2, *again.strategy);
  EXPECT_EQ(r.index, older.index);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].message.find("manifest.json says step_count 4, counters.pt holds 9"),
            std::string::npos)
      << r.skipped[0].message;
  // Asked for by index, the mismatch is an error, not a fallback.
  ToyRun third(0.3);
  EXPECT_THROW(restore_checkpoint(store2, *third.strategy, newer.index), DataError);

  // A relative symlink inside the store (pointing inside it) is not followed.
  const fs::path file = dir2 / newer.dir / "counters.pt";
  fs::copy_file(file, dir2 / "counters_copy.pt");
  fs::remove(file);
  fs::create_symlink("../counters_copy.pt", file);
  try {
    store2.verify(newer.index);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link inside the checkpoint directory"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

}  // namespace
}  // namespace crucible
