// Issue 8: faults during a run, through the real binary.
// - A diverging run (a learning rate of 1e150) stops at its first
//   non-finite loss with exit code 3 and a checkpoint of the last good step
//   (finite weights, zero gradients); with spike skipping it runs on.
// - A run directory that cannot take a 1 MiB file (ulimit -f) is refused
//   before training, and nothing is written or removed.
// - A checkpoint write that fails mid-run (the file-size limit drops to
//   4 KiB after batch 3) is reported with the intact older checkpoint, and
//   the run resumes from that one to the end.

#include <gtest/gtest.h>

#include <torch/serialize/input-archive.h>

#include <filesystem>
#include <string>

#include "bad_inputs/run_binary.h"
#include "crucible/checkpoint/checkpoint_store.h"

namespace {

using namespace crucible::testing;
namespace fs = std::filesystem;

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_dir("crucible_faults");
    write_text(dir_ / "tiny.xyz", tial_frames(10));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::vector<std::string> args(const fs::path& run, std::vector<std::string> extra) const {
    auto a = tiny_training_args(dir_ / "tiny.xyz", run);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  fs::path dir_;
};

/// Every tensor of a checkpoint archive file.
std::vector<at::Tensor> tensors_of(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream is(bytes);
  archive.load_from(is);
  std::vector<at::Tensor> out;
  for (const auto& key : archive.keys()) {
    at::Tensor t;
    archive.read(key, t);
    out.push_back(t);
  }
  return out;
}

TEST_F(Faults, NonFiniteLossStopsWithACheckpointOfTheLastGoodStep) {
  const fs::path run = dir_ / "run";
  const Outcome o = run_crucible(dir_, args(run, {"training.num_epochs=20", "training.optimizer.lr=1e150"}));
  EXPECT_EQ(o.rc, 3) << o.err;
  const std::string line = last_line(o.err);
  EXPECT_NE(line.find("crucible: error: training stopped: non-finite loss (nan) at step "), std::string::npos)
      << line;
  EXPECT_NE(line.find("The optimizer step was not applied"), std::string::npos) << line;
  EXPECT_NE(line.find("resume with: crucible train --resume " + run.string()), std::string::npos) << line;
  EXPECT_FALSE(fs::exists(run / "summary.json"));

  crucible::checkpoint::CheckpointStore store(run / "checkpoints");
  const auto entries = store.list();
  ASSERT_FALSE(entries.empty());
  const auto& last = entries.back();
  // The stop checkpoint holds the step the message names.
  EXPECT_NE(line.find("the weights are those after step " + std::to_string(last.counters.step_count)),
            std::string::npos)
      << line;
  const auto files = store.load(last.index);
  for (const auto& t : tensors_of(files.at("model.main.pt"))) {
    EXPECT_TRUE(t.isfinite().all().item<bool>()) << "a non-finite weight was checkpointed";
  }
  for (const auto& t : tensors_of(files.at("grads.main.pt"))) {
    if (t.numel() > 0) EXPECT_EQ(t.abs().max().item<double>(), 0.0) << "gradients must be zeroed";
  }
}

// With spike skipping the diverged model's non-finite steps are skipped,
// not stopped at; a run whose every step is skipped then stops after
// training.max_batches_without_step batches instead of looping forever.
TEST_F(Faults, SpikeSkippingSkipsNonFiniteStepsAndAHopelessRunStillEnds) {
  const fs::path run = dir_ / "run";
  const Outcome o = run_crucible(dir_, args(run, {"training.num_epochs=5", "training.optimizer.lr=1e150",
                                                  "training.spike_skipping.enabled=true",
                                                  "training.max_batches_without_step=25"}));
  EXPECT_EQ(o.rc, 3) << o.err;
  const std::string line = last_line(o.err);
  EXPECT_EQ(line.find("crucible: error: training stopped: non-finite loss"), std::string::npos) << line;
  EXPECT_NE(line.find("crucible: error: training stopped: 25 batches in a row ended without an optimizer step"),
            std::string::npos)
      << line;
  EXPECT_FALSE(fs::exists(run / "summary.json"));
}

TEST_F(Faults, RunDirectoryThatCannotTakeAProbeWriteIsRefusedBeforeTraining) {
  const fs::path run = dir_ / "run";
  fs::create_directories(run);
  write_text(run / "metrics.csv", "kept\n");  // an earlier run's file: must survive
  // 512 KiB file-size limit: the 1 MiB probe fails with EFBIG, like a full disk.
  const Outcome o = run_crucible(dir_, args(run, {"training.num_epochs=1", "output.overwrite=true"}), "ulimit -f 512");
  EXPECT_EQ(o.rc, 1) << o.err;
  EXPECT_EQ(last_line(o.err), "crucible: error: " + run.string() +
                                  ": run directory must be writable with free space, got File too large (a 1 MiB "
                                  "probe write failed before training; nothing of the run was changed)");
  EXPECT_EQ(read_text(run / "metrics.csv"), "kept\n");
  EXPECT_FALSE(fs::exists(run / "config.yaml"));
  EXPECT_FALSE(fs::exists(run / "checkpoints"));
  for (const auto& e : fs::directory_iterator(run)) {
    EXPECT_EQ(e.path().filename().string().rfind(".crucible-write-probe", 0), std::string::npos)
        << "probe file left behind";
  }
}

TEST_F(Faults, FailedCheckpointWriteIsReportedAndTheOlderCheckpointResumes) {
  const fs::path run = dir_ / "run";
  const std::vector<std::string> extra = {"training.num_epochs=3", "output.checkpoint_every_n_steps=1",
                                          "output.keep_last_checkpoints=0"};
  const Outcome o =
      run_crucible(dir_, args(run, extra), "", {"CRUCIBLE_FAULT_FILE_SIZE_LIMIT_AT_BATCH=3"});
  EXPECT_EQ(o.rc, 3) << o.err;
  const std::string line = last_line(o.err);
  EXPECT_NE(line.find("crucible: error: checkpoint at step 3 could not be written to " +
                      (run / "checkpoints").string()),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("earlier checkpoints are unchanged (the newest, ckpt-000001 (step 2), is intact)"),
            std::string::npos)
      << line;

  crucible::checkpoint::CheckpointStore store(run / "checkpoints");
  const auto entries = store.list();
  ASSERT_EQ(entries.size(), 2u);
  for (const auto& e : entries) EXPECT_NO_THROW(store.verify(e.index));
  EXPECT_EQ(entries.back().counters.step_count, 2);

  // Issue 15: the message names the cause (a file-size limit, not a full disk).
  EXPECT_NE(line.find("A file-size limit was reached"), std::string::npos) << line;
  EXPECT_EQ(line.find("Free disk space"), std::string::npos) << line;
  // A kill during a save leaves a temporary folder; an empty summary.json
  // (copied by hand, cut by a full disk) is no finished run.
  fs::create_directories(run / "checkpoints" / ".tmp-ckpt-000009-stale");
  write_text(run / "summary.json", "");

  const Outcome resumed = run_crucible(dir_, {"train", "--resume", run.string()});
  EXPECT_EQ(resumed.rc, 0) << resumed.err;
  EXPECT_TRUE(fs::exists(run / "summary.json"));
  EXPECT_FALSE(fs::exists(run / "checkpoints" / ".tmp-ckpt-000009-stale"));
}

}  // namespace
