// End-to-end tests of the `crucible` executable (CRUCIBLE_BINARY): train,
// evaluate, config, malformed input, exit codes. Build both targets:
//   ninja crucible test_cli

#include "crucible/run/training_setup.h"
#include "crucible/common/error.h"
#include "crucible/config/config.h"

#include "cli/e2e_helpers.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <sys/file.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace crucible {
namespace {

using namespace e2e;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fs::exists(CRUCIBLE_BINARY))
        << CRUCIBLE_BINARY << " does not exist: build the `crucible` target too";
    dir_ = fs::temp_directory_path() / ("crucible_cli_test_" + std::to_string(::getpid()));
    ASSERT_TRUE(make_tiny_tial_dir(dir_));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  /// Small, fast training settings on the tiny files.
  static std::vector<std::string> tiny_args(const std::string& run_dir) {
    return {"train",
            "data.train_file=" + (dir_ / "tiny.xyz").string(),
            "data.valid_file=" + (dir_ / "tiny_valid.xyz").string(),
            "training.num_epochs=2",
            "training.batch_size=4",
            "model.schnet.hidden_channels=8",
            "model.schnet.num_filters=8",
            "model.schnet.num_interactions=1",
            "output.run_dir=" + run_dir};
  }

  static fs::path dir_;
};

fs::path CliTest::dir_;

TEST_F(CliTest, HelpListsCommandsAndOptions) {
  Result r = run_crucible(dir_, {"--help"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("train"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("evaluate"), std::string::npos) << r.out;
  r = run_crucible(dir_, {"train", "--help"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("--config"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--print-config"), std::string::npos) << r.out;
  r = run_crucible(dir_, {"evaluate", "--help"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("--model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--data"), std::string::npos) << r.out;
}

TEST_F(CliTest, BadUsageExitsOne) {
  Result r = run_crucible(dir_, {"frobnicate"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("crucible: error: "), std::string::npos) << r.err;
  r = run_crucible(dir_, {"evaluate", "--data", "x.xyz"});  // --model missing
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
}

TEST_F(CliTest, DumpDefaultConfigLoadsBackAsDefaults) {
  Result r = run_crucible(dir_, {"config", "--dump-default"});
  ASSERT_EQ(r.rc, 0) << r.err;
  Config c = default_config();
  apply_config_yaml(c, r.out, "dump");
  EXPECT_EQ(c, default_config());
  r = run_crucible(dir_, {"train", "--print-config", "training.num_epochs=7"});
  ASSERT_EQ(r.rc, 0) << r.err;
  Config p = default_config();
  apply_config_yaml(p, r.out, "print");
  EXPECT_EQ(p.training.num_epochs.value(), 7);
}

TEST_F(CliTest, ConfigErrorsExitOneWithoutRunDirectory) {
  const fs::path run = dir_ / "run_badcfg";
  Result r = run_crucible(dir_, {"train", "training.optimiser.lr=0.1", "output.run_dir=" + run.string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("crucible: error: unknown config key 'training.optimiser'"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(run));

  write_text(dir_ / "bad.yaml", "training:\n  num_epochs: 2\n  optimizer: {lr: [1, 2}\n");
  r = run_crucible(dir_, {"train", "--config", (dir_ / "bad.yaml").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("crucible: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bad.yaml:3"), std::string::npos) << r.err;

  write_text(dir_ / "typo.yaml", "model:\n  cutof: 4.0\n");
  r = run_crucible(dir_, {"train", "--config", (dir_ / "typo.yaml").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("unknown config key 'model.cutof' in "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(line 2)"), std::string::npos) << r.err;

  r = run_crucible(dir_, {"train", "data.train_file=" + (dir_ / "missing.xyz").string(),
                          "output.run_dir=" + run.string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("missing.xyz"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run));
}

TEST_F(CliTest, TrainWritesRunDirectoryAndEvaluateMatches) {
  const fs::path run = dir_ / "run_tiny";
  Result r = run_crucible(dir_, tiny_args(run.string()));
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  for (const char* f : {"config.yaml", "metrics.csv", "model.pt", "model.json", "summary.json"}) {
    EXPECT_TRUE(fs::exists(run / f)) << f;
  }
  EXPECT_NE(r.out.find("epoch 1/2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zero-forces baseline"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wall time"), std::string::npos) << r.out;

  // config.yaml is the resolved config, loadable as a config file.
  const Config resolved = load_config_file((run / "config.yaml").string());
  EXPECT_EQ(resolved.training.num_epochs.value(), 2);
  EXPECT_EQ(std::get<int64_t>(resolved.model.params.at("schnet.hidden_channels")), 8);
  EXPECT_EQ(resolved.output.run_dir.value(), run.string());

  // metrics.csv: header and one row per epoch.
  std::istringstream csv(read_text(run / "metrics.csv"));
  std::string header, line;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("epoch,step,elapsed_s,train_loss", 0), 0u) << header;
  EXPECT_NE(header.find("valid_forces_mae"), std::string::npos) << header;
  int rows = 0;
  while (std::getline(csv, line)) {
    if (!line.empty()) ++rows;
  }
  EXPECT_EQ(rows, 2);

  const auto summary = nlohmann::json::parse(read_text(run / "summary.json"));
  EXPECT_TRUE(summary.at("finished").get<bool>());
  EXPECT_EQ(summary.at("epochs_completed").get<int>(), 2);
  const auto& v = summary.at("validation");
  const double f_mae = v.at("forces_mae").get<double>();
  EXPECT_TRUE(std::isfinite(f_mae));
  EXPECT_GT(v.at("zero_forces_mae").get<double>(), 0.0);

  const auto model = nlohmann::json::parse(read_text(run / "model.json"));
  EXPECT_EQ(model.at("model_type"), "schnet");
  EXPECT_EQ(model.at("elements"), nlohmann::json({"Al", "Ti"}));
  EXPECT_EQ(model.at("hyperparameters").at("hidden_channels"), 8);

  // evaluate on the validation file reproduces the final validation metrics.
  const fs::path metrics_json = dir_ / "eval.json";
  r = run_crucible(dir_, {"evaluate", "--model", run.string(), "--data",
                          (dir_ / "tiny_valid.xyz").string(), "--json", metrics_json.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("structures 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("meV/atom"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("meV/Å"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zero-forces baseline"), std::string::npos) << r.out;
  const auto eval = nlohmann::json::parse(read_text(metrics_json));
  for (const char* k : {"energy_mae", "energy_rmse", "forces_mae", "forces_rmse",
                        "zero_forces_mae", "stress_mae"}) {
    const double a = eval.at(k).get<double>();
    const double b = v.at(k).get<double>();
    EXPECT_NEAR(a, b, 1e-6 * std::max(1.0, std::abs(b))) << k;
  }

  // A finished run is not overwritten without output.overwrite.
  r = run_crucible(dir_, tiny_args(run.string()));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("finished run"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(run / "summary.json"));

  // ... and is replaced with it.
  auto again = tiny_args(run.string());
  again.push_back("output.overwrite=true");
  again.push_back("training.num_epochs=1");
  r = run_crucible(dir_, again);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(read_text(run / "summary.json")).at("epochs_completed"), 1);

  // Evaluate errors: a directory without a model.
  r = run_crucible(dir_, {"evaluate", "--model", (dir_ / "nope").string(), "--data",
                          (dir_ / "tiny_valid.xyz").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("crucible: error: "), std::string::npos) << r.err;
  r = run_crucible(dir_, {"evaluate", "--model", run.string(), "--data",
                          (dir_ / "tiny_valid.xyz").string(), "training.num_epochs=3"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("only data.*"), std::string::npos) << r.err;
}

// Issue 4 acceptance: the README's distillation example trains a small
// student from a frozen teacher (named models; the teacher is restored).
TEST(Examples, DistillationStudentApproachesTheFrozenTeacher) {
  const std::string cmd = std::string(CRUCIBLE_EXAMPLE_DISTILL) +
                          " --teacher-epochs 2 --epochs 3 --frames 80 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  std::smatch m;
  const std::regex re("force MAE ([0-9.]+) -> ([0-9.]+) meV/A");
  ASSERT_TRUE(std::regex_search(out, m, re)) << out;
  const double before = std::stod(m[1].str()), after = std::stod(m[2].str());
  EXPECT_LT(after, 0.6 * before) << out;
  EXPECT_NE(out.find("teacher requires_grad restored after the run: yes"), std::string::npos)
      << out;
}

// Issue 5: SIGTERM mid-run writes a checkpoint and exits cleanly; --resume
// continues at the next batch and ends exactly where an uninterrupted run does.
TEST_F(CliTest, SigtermThenResumeMatchesAnUninterruptedRun) {
  const fs::path full = dir_ / "run_full";
  auto args = tiny_args(full.string());
  args.push_back("training.num_epochs=3");
  Result r = run_crucible(dir_, args);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;

  const fs::path cut = dir_ / "run_cut";
  args = tiny_args(cut.string());
  args.push_back("training.num_epochs=3");
  ::setenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH", "4", 1);
  r = run_crucible(dir_, args);
  ::unsetenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH");
  ASSERT_EQ(r.rc, 143) << r.out << r.err;  // 128 + SIGTERM (issue 15)
  // The signal arrives at the end of batch 4, after the checkpoint hook
  // looked: batch 5 finishes, then the run stops. 10 structures, batch 4:
  // 3 batches an epoch, so batch 5 is the second of epoch 2.
  EXPECT_NE(r.out.find("stopped by a signal after step 5 (epoch 2, batch 2 of 3)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("resume with: crucible train --resume " + cut.string()),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(cut / "summary.json"));
  EXPECT_TRUE(fs::exists(cut / "checkpoints" / "manifest.json"));

  const auto a = nlohmann::json::parse(read_text(full / "summary.json")).at("validation");

  // The C++ API (seed 002 load_checkpoint): the run rebuilt from the
  // checkpoint's recipe.json plus runtime pieces continues exactly too.
  {
    int validator_calls = 0;
    TrainingRuntime runtime;
    runtime.device = "cpu";
    runtime.validators.push_back([&](const LoadedCheckpoint& c) {
      ++validator_calls;
      EXPECT_EQ(c.entry.counters.step_count, 5);
    });
    RestoredCheckpoint restored;
    TrainingSetup setup =
        load_training_from_checkpoint(cut / "checkpoints", runtime, std::nullopt, &restored);
    EXPECT_EQ(validator_calls, 1);
    EXPECT_TRUE(restored.skipped.empty());
    EXPECT_EQ(setup.strategy->step_count, 5);
    setup.strategy->run(*setup.loader);
    ASSERT_TRUE(setup.strategy->last_validation());
    EXPECT_EQ(setup.strategy->last_validation()->energy_mae, a.at("energy_mae").get<double>());
    EXPECT_EQ(setup.strategy->last_validation()->forces_mae, a.at("forces_mae").get<double>());
    // A validator that refuses stops the load with its error.
    runtime.validators = {[](const LoadedCheckpoint&) { throw DataError("refused by test"); }};
    EXPECT_THROW(load_training_from_checkpoint(cut / "checkpoints", runtime), DataError);
  }

  // A recipe change that matters is refused, listing the key.
  r = run_crucible(dir_, {"train", "--resume", cut.string(), "model.schnet.hidden_channels=16"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("model.schnet.hidden_channels: 8 -> 16"), std::string::npos) << r.err;

  r = run_crucible(dir_, {"train", "--resume", cut.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resuming from checkpoint"), std::string::npos) << r.out;
  const auto b = nlohmann::json::parse(read_text(cut / "summary.json")).at("validation");
  for (const char* k : {"energy_mae", "forces_mae", "stress_mae"}) {
    EXPECT_EQ(a.at(k), b.at(k)) << k;  // bit-identical continuation
  }
  // The metrics of both halves are in one metrics.jsonl.
  const std::string jsonl = read_text(cut / "metrics.jsonl");
  EXPECT_NE(jsonl.find("\"step\":1,"), std::string::npos) << jsonl.substr(0, 400);
  // A finished run cannot be resumed.
  r = run_crucible(dir_, {"train", "--resume", cut.string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("the run finished"), std::string::npos) << r.err;
}

// Issue 19: training.num_threads 0 (auto) records the threads a run used in
// each checkpoint (threads.json), and a resume takes them instead of
// choosing anew, since the thread count can change the last bits.
TEST_F(CliTest, AutoThreadsAreRecordedAndAResumeTakesThem) {
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string saved_value = saved ? saved : "";
  const fs::path cut = dir_ / "run_threads";
  auto args = tiny_args(cut.string());
  args.push_back("training.num_epochs=3");
  ::setenv("OMP_NUM_THREADS", "2", 1);
  ::setenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH", "4", 1);
  Result r = run_crucible(dir_, args);
  ::unsetenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH");
  ASSERT_EQ(r.rc, 143) << r.out << r.err;
  EXPECT_NE(r.out.find("CPU threads: 2 (auto: OMP_NUM_THREADS)"), std::string::npos) << r.out;
  int checkpoints = 0;
  for (const auto& e : fs::directory_iterator(cut / "checkpoints")) {
    if (!e.is_directory() || e.path().filename().string().rfind("ckpt-", 0) != 0) continue;
    ++checkpoints;
    EXPECT_EQ(nlohmann::json::parse(read_text(e.path() / kThreadsFile)).at("cpu_threads").get<int>(), 2) << e.path();
  }
  EXPECT_GT(checkpoints, 0);
  // The resume would choose 1 thread (OMP_NUM_THREADS=1) but takes the checkpoint's 2.
  ::setenv("OMP_NUM_THREADS", "1", 1);
  {
    TrainingRuntime runtime;
    TrainingSetup setup = load_training_from_checkpoint(cut / "checkpoints", runtime);
    EXPECT_EQ(setup.threads.threads, 2);
    EXPECT_EQ(at::get_num_threads(), 2);
    EXPECT_EQ(setup.config.training.num_threads, 0);  // the recipe stays auto
    EXPECT_NE(setup.threads.describe().find("as the checkpoint was written with"), std::string::npos);
  }
  at::set_num_threads(1);
  r = run_crucible(dir_, {"train", "--resume", cut.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("CPU threads 2, as the checkpoint was written with (training.num_threads 0)"),
            std::string::npos)
      << r.out;
  // An explicit count is a plain setting.
  args = tiny_args((dir_ / "run_threads_1").string());
  args.push_back("training.num_threads=1");
  r = run_crucible(dir_, args);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("CPU threads: 1 (training.num_threads)"), std::string::npos) << r.out;
  if (saved) ::setenv("OMP_NUM_THREADS", saved_value.c_str(), 1);
  else ::unsetenv("OMP_NUM_THREADS");
}

// Issue 14: periodic frames with a virial mixed with frames without one (as
// in MOF or MACE's regression sets) train at batch sizes 1, 2 and 4 (batches
// without any stress label included) and resume exactly after a SIGTERM.
TEST_F(CliTest, HalfTheFramesWithoutStressTrainAndResumeExactly) {
  const auto frames = frames_of(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
  std::string mixed;
  const std::regex virial(R"( virial="[^"]*")");
  for (size_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(std::regex_search(frames[i], virial)) << "frame " << i << " has no virial";
    mixed += i % 2 == 1 ? std::regex_replace(frames[i], virial, "") : frames[i];
  }
  write_text(dir_ / "mixed_stress.xyz", mixed);
  for (const int batch_size : {1, 2, 4}) {
    SCOPED_TRACE("batch_size=" + std::to_string(batch_size));
    const auto args_for = [&](const fs::path& run) {
      auto a = tiny_args(run.string());
      a[1] = "data.train_file=" + (dir_ / "mixed_stress.xyz").string();
      a.push_back("training.batch_size=" + std::to_string(batch_size));
      return a;
    };
    const fs::path full = dir_ / ("mixed_full_" + std::to_string(batch_size));
    Result r = run_crucible(dir_, args_for(full));
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    const auto a = nlohmann::json::parse(read_text(full / "summary.json"));
    EXPECT_TRUE(std::isfinite(a.at("validation").at("forces_mae").get<double>()));

    const fs::path cut = dir_ / ("mixed_cut_" + std::to_string(batch_size));
    // Stop after the first batch of the second epoch (8 / batch_size batches an epoch).
    ::setenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH", std::to_string(8 / batch_size).c_str(), 1);
    r = run_crucible(dir_, args_for(cut));
    ::unsetenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH");
    ASSERT_EQ(r.rc, 143) << r.out << r.err;
    ASSERT_FALSE(fs::exists(cut / "summary.json")) << r.out;
    r = run_crucible(dir_, {"train", "--resume", cut.string()});
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    const auto b = nlohmann::json::parse(read_text(cut / "summary.json"));
    for (const char* k : {"energy_mae", "forces_mae", "stress_mae"}) {
      EXPECT_EQ(a.at("validation").at(k), b.at("validation").at(k)) << k;
    }
  }
}

/// Starts `crucible <args>` in `cwd` with `env` ("KEY=VALUE", may be empty)
/// in the background, output to /dev/null; returns its pid.
pid_t start_crucible(const fs::path& cwd, const std::vector<std::string>& args,
                     const std::string& env = "") {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (::chdir(cwd.c_str()) != 0) ::_exit(127);
  if (!env.empty()) ::putenv(const_cast<char*>(env.c_str()));
  std::vector<char*> argv{const_cast<char*>(CRUCIBLE_BINARY)};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int null = ::open("/dev/null", O_WRONLY);
  ::dup2(null, 1);
  ::dup2(null, 2);
  ::execv(CRUCIBLE_BINARY, argv.data());
  ::_exit(127);
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Issue 15: one writer per run directory. A second writer (fresh, overwrite,
// resume) is refused naming the holder; a lock left by a killed run never
// blocks its resume; of two fresh runs started together on one directory
// exactly one trains.
TEST_F(CliTest, OneWriterPerRunDirectory) {
  const fs::path live = dir_ / "run_live";
  auto args = tiny_args(live.string());
  args.insert(args.end(), {"training.num_epochs=null", "training.num_steps=100",
                           "output.checkpoint_every_n_steps=1"});
  const pid_t holder = start_crucible(dir_, args, "CRUCIBLE_FAULT_SLEEP_MS_PER_BATCH=150");
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(live / "checkpoints" / "manifest.json") &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fs::exists(live / "checkpoints" / "manifest.json"));
  const std::string in_use = "is in use by another crucible process (pid " + std::to_string(holder);
  auto overwrite = args;
  overwrite.push_back("output.overwrite=true");
  for (const auto& intruder : {overwrite, args, std::vector<std::string>{"train", "--resume", live.string()}}) {
    const Result r = run_crucible(dir_, intruder);
    EXPECT_EQ(r.rc, 1) << r.out << r.err;
    EXPECT_NE(r.err.find(in_use), std::string::npos) << r.err;
  }
  EXPECT_TRUE(fs::exists(live / "checkpoints" / "manifest.json"));  // nothing of the live run removed
  EXPECT_TRUE(fs::exists(live / "metrics.csv"));
  ::kill(holder, SIGKILL);
  EXPECT_EQ(wait_exit_code(holder), 128 + SIGKILL);
  const Result resumed = run_crucible(dir_, {"train", "--resume", live.string()});
  ASSERT_EQ(resumed.rc, 0) << resumed.out << resumed.err;
  EXPECT_EQ(nlohmann::json::parse(read_text(live / "summary.json")).at("steps"), 100);

  // Two fresh runs on one empty directory.
  const fs::path twice = dir_ / "run_twice";
  fs::create_directories(twice);
  auto fresh = tiny_args(twice.string());
  fresh.insert(fresh.end(), {"training.num_epochs=null", "training.num_steps=10"});
  const pid_t a = start_crucible(dir_, fresh, "CRUCIBLE_FAULT_SLEEP_MS_PER_BATCH=100");
  const pid_t b = start_crucible(dir_, fresh, "CRUCIBLE_FAULT_SLEEP_MS_PER_BATCH=100");
  const int ra = wait_exit_code(a), rb = wait_exit_code(b);
  EXPECT_EQ((ra == 0) + (rb == 0), 1) << ra << " " << rb;
  EXPECT_EQ((ra == 1) + (rb == 1), 1) << ra << " " << rb;
}

// Issue 47: inside a 3 GiB memory cgroup the memory check said "21.5 GiB
// available" (the host's). Where this machine lets a test make a cgroup
// (root, cgroup v1 memory controller or v2), a model whose training state
// needs ~5.4 GB is refused naming under 3 GiB, before anything is allocated.
TEST_F(CliTest, TheMemoryCheckReadsTheCgroupLimitWhereOneCanBeSet) {
  const std::string name = "crucible_test_" + std::to_string(::getpid());
  fs::path cgroup = fs::path("/sys/fs/cgroup/memory") / name;
  std::string limit_file = "memory.limit_in_bytes";
  std::error_code ec;
  if (!fs::create_directory(cgroup, ec)) {
    cgroup = fs::path("/sys/fs/cgroup") / name;  // cgroup v2
    limit_file = "memory.max";
    if (!fs::exists("/sys/fs/cgroup/cgroup.controllers") || !fs::create_directory(cgroup, ec)) {
      GTEST_SKIP() << "no memory cgroup can be made here";
    }
  }
  {
    std::ofstream limit(cgroup / limit_file);
    limit << (int64_t{3} << 30) << "\n";
  }
  const std::string readback = read_text(cgroup / limit_file);
  if (readback.rfind(std::to_string(int64_t{3} << 30), 0) != 0) {  // the limit must bind, or the model is built
    ::rmdir(cgroup.c_str());
    GTEST_SKIP() << "the cgroup takes no memory limit here";
  }
  const fs::path wrapper = dir_ / "in_cgroup.sh";
  write_text(wrapper, "#!/bin/sh\necho $$ > " + shell_quote((cgroup / "cgroup.procs").string()) + " || exit 99\nexec " +
                          shell_quote(CRUCIBLE_BINARY) + " \"$@\"\n");
  fs::permissions(wrapper, fs::perms::owner_all);
  const fs::path err_file = dir_ / "cgroup_err.txt";
  std::string cmd = "cd " + shell_quote(dir_.string()) + " && " + shell_quote(wrapper.string());
  auto args = tiny_args((dir_ / "run_cgroup").string());
  args.insert(args.end(), {"model.schnet.hidden_channels=9000", "model.schnet.num_filters=9000"});  // ~5.4 GB of state
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " >/dev/null 2>" + shell_quote(err_file.string());
  const int status = std::system(cmd.c_str());
  const std::string err = read_text(err_file);
  ::rmdir(cgroup.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 99) GTEST_SKIP() << "cannot join the cgroup";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << err;
  const std::regex available("exceeds the ([0-9.]+) GiB of memory available");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, available)) << err;
  EXPECT_LE(std::stod(m[1]), 3.0) << err;
  EXPECT_FALSE(fs::exists(dir_ / "run_cgroup"));
}

// Issue 47: --config configs/NAME.yaml is found from any folder, as data/
// paths are; a missing one names where it was looked for (exit 1).
TEST_F(CliTest, ConfigPathsResolveAsDataPathsDo) {
  Result r = run_crucible(dir_, {"config", "--config", "configs/mace.yaml"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("type: \"mace\""), std::string::npos) << r.out;
  r = run_crucible(dir_, {"spec", "dump", "--config", "configs/mace.yaml"});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = run_crucible(dir_, {"train", "--config", "configs/nope.yaml"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--config file 'configs/nope.yaml' does not exist or is not a file (looked in: "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(std::string(CRUCIBLE_SOURCE_DIR) + "/configs/nope.yaml"), std::string::npos) << r.err;
}

// Issue 47: the lock is taken before any data is read (a holder is reported
// even when this run's data file is bad), and a start refused after taking
// it leaves no directory holding only .lock.
TEST_F(CliTest, TheLockComesBeforeTheDataAndARefusedStartLeavesNothing) {
  const fs::path held = dir_ / "run_held";
  fs::create_directories(held);
  const int fd = ::open((held / ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ASSERT_EQ(::pwrite(fd, "pid 1 on host test, since now\n", 30, 0), 30);
  write_text(dir_ / "broken.xyz", "2\nProperties=species:S:1:pos:R:3 energy=x\nH 0 0 0\n");
  auto args = tiny_args(held.string());
  args.push_back("data.train_file=broken.xyz");
  Result r = run_crucible(dir_, args);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("is in use by another crucible process (pid 1 on host test"), std::string::npos) << r.err;
  ::close(fd);
  // Refused after the lock: a data error leaves no run directory behind.
  const fs::path fresh = dir_ / "run_refused";
  args = tiny_args(fresh.string());
  args.push_back("data.train_file=broken.xyz");
  r = run_crucible(dir_, args);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.err.find("broken.xyz"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(fresh)) << "left behind: " << fresh;
  // A directory the user made stays, without a .lock of ours.
  fs::create_directories(fresh);
  r = run_crucible(dir_, args);
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(fs::is_directory(fresh));
  EXPECT_FALSE(fs::exists(fresh / ".lock"));
}

/// metrics.csv without its elapsed_s column (the 3rd).
std::string csv_without_times(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    const auto a = line.find(','), b = line.find(',', a + 1), c = line.find(',', b + 1);
    out += line.substr(0, b) + line.substr(c) + "\n";
  }
  return out;
}

/// metrics.jsonl lines without "elapsed_s".
std::string jsonl_without_times(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    j.erase("elapsed_s");
    out += j.dump() + "\n";
  }
  return out;
}

// Issue 15: killed at any point (SIGKILL after a batch whose checkpoint is
// not yet written, in the middle and at the end of an epoch) or stopped by
// SIGTERM, then resumed: metrics.csv, metrics.jsonl and summary.json equal
// an uninterrupted run's apart from elapsed times.
TEST_F(CliTest, ResumedMetricsEqualAnUninterruptedRunsApartFromTimes) {
  const auto args_for = [&](const fs::path& run) {
    auto a = tiny_args(run.string());
    a.insert(a.end(), {"training.num_epochs=3", "output.checkpoint_every_n_steps=1",
                       "output.log_every_n_steps=1"});
    return a;
  };
  const fs::path full = dir_ / "metrics_full";
  Result r = run_crucible(dir_, args_for(full));
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const std::string csv = csv_without_times(read_text(full / "metrics.csv"));
  const std::string jsonl = jsonl_without_times(read_text(full / "metrics.jsonl"));
  auto summary = nlohmann::json::parse(read_text(full / "summary.json"));
  summary.erase("wall_time_s");
  summary.erase("run_dir");
  // 10 structures, batch 4: 3 batches an epoch, 9 in all.
  for (const std::string fault : {"KILL=2", "KILL=3", "KILL=7", "SIGTERM=4"}) {
    SCOPED_TRACE(fault);
    const fs::path cut = dir_ / ("metrics_cut_" + fault.substr(0, fault.find('=')) + "_" +
                                 fault.substr(fault.find('=') + 1));
    const std::string at = fault.substr(fault.find('=') + 1);
    const bool kill = fault.rfind("KILL", 0) == 0;
    ::setenv(kill ? "CRUCIBLE_FAULT_KILL_AT_BATCH" : "CRUCIBLE_FAULT_SIGTERM_AT_BATCH",
             (kill ? "0:" + at : at).c_str(), 1);
    r = run_crucible(dir_, args_for(cut));
    ::unsetenv("CRUCIBLE_FAULT_KILL_AT_BATCH");
    ::unsetenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH");
    EXPECT_EQ(r.rc, kill ? 128 + 9 : 143) << r.out << r.err;  // the shell reports SIGKILL as 137
    ASSERT_FALSE(fs::exists(cut / "summary.json"));
    r = run_crucible(dir_, {"train", "--resume", cut.string()});
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    EXPECT_EQ(csv_without_times(read_text(cut / "metrics.csv")), csv);
    EXPECT_EQ(jsonl_without_times(read_text(cut / "metrics.jsonl")), jsonl);
    auto s = nlohmann::json::parse(read_text(cut / "summary.json"));
    s.erase("wall_time_s");
    s.erase("run_dir");
    EXPECT_EQ(s, summary);
  }
}

// Issue 47: a metrics file cut shorter than the checkpoint recorded was
// padded with NUL bytes, and a deleted metrics.csv made --resume refuse.
// Now the short file goes on after its last complete line and the missing
// one starts anew, each with a warning; no NUL byte anywhere.
TEST_F(CliTest, ResumeNeverPadsAShortMetricsFileAndStartsAMissingOneAnew) {
  const fs::path run = dir_ / "metrics_short";
  auto args = tiny_args(run.string());
  args.insert(args.end(), {"training.num_epochs=3", "output.checkpoint_every_n_steps=1", "output.log_every_n_steps=1"});
  ::setenv("CRUCIBLE_FAULT_KILL_AT_BATCH", "0:7", 1);
  Result r = run_crucible(dir_, args);
  ::unsetenv("CRUCIBLE_FAULT_KILL_AT_BATCH");
  ASSERT_EQ(r.rc, 128 + 9) << r.out << r.err;
  const std::string jsonl = read_text(run / "metrics.jsonl");
  ASSERT_GT(jsonl.size(), 200u);
  // Keep the first two lines and half of the third.
  size_t cut = jsonl.find('\n', jsonl.find('\n') + 1) + 1;
  const size_t third_end = jsonl.find('\n', cut);
  cut += (third_end - cut) / 2;
  write_text(run / "metrics.jsonl", jsonl.substr(0, cut));
  fs::remove(run / "metrics.csv");
  r = run_crucible(dir_, {"train", "--resume", run.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.err.find((run / "metrics.csv").string() + " is missing"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find((run / "metrics.jsonl").string() + " has " + std::to_string(cut) + " bytes, fewer than"),
            std::string::npos)
      << r.err;
  for (const char* name : {"metrics.jsonl", "metrics.csv"}) {
    const std::string text = read_text(run / name);
    EXPECT_EQ(text.find('\0'), std::string::npos) << name;
    EXPECT_FALSE(text.empty()) << name;
    EXPECT_EQ(text.back(), '\n') << name;
  }
  // Every jsonl line parses: the torn third line is gone, the rest is whole.
  std::istringstream lines(read_text(run / "metrics.jsonl"));
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    EXPECT_NO_THROW((void)nlohmann::json::parse(line)) << line;
    ++n;
  }
  EXPECT_GT(n, 2);
  EXPECT_EQ(read_text(run / "metrics.csv").rfind("epoch,step,", 0), 0u);  // a header, then the rows from here
}

// Issue 15: a metrics write that fails (a file-size limit) stops the run
// with exit 3 naming the file, the cause and the checkpoint to resume from.
TEST_F(CliTest, AFailedMetricsWriteStopsTheRun) {
  const fs::path run = dir_ / "metrics_limit";
  auto args = tiny_args(run.string());
  args.insert(args.end(), {"training.num_epochs=20", "output.log_every_n_steps=1",
                           "output.checkpoint_every_n_epochs=0"});
  // From batch 2 on no file may grow past 4 KiB: metrics.jsonl does first.
  ::setenv("CRUCIBLE_FAULT_FILE_SIZE_LIMIT_AT_BATCH", "2", 1);
  const Result r = run_crucible(dir_, args);
  ::unsetenv("CRUCIBLE_FAULT_FILE_SIZE_LIMIT_AT_BATCH");
  EXPECT_EQ(r.rc, 3) << r.out << r.err;
  EXPECT_NE(r.err.find((run / "metrics.jsonl").string() + ": a metrics line could not be written (File too large)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("A file-size limit was reached"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run / "summary.json"));
}

TEST_F(CliTest, BadConfigFromTheCatalogStopsBeforeAnythingIsWritten) {
  const fs::path run = dir_ / "run_bad_config";
  auto args = tiny_args(run.string());
  args.push_back("--config");
  args.push_back(std::string(CRUCIBLE_SOURCE_DIR) +
                 "/tests/cli/bad_configs/09_option_of_another_optimizer.yaml");
  Result r = run_crucible(dir_, args);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("training.optimizer.momentum is an option of sgd, rmsprop only"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(run));
}

TEST_F(CliTest, TrainWithHuberLossConfigTypeWeightsAndAWeightSchedule) {
  const fs::path run = dir_ / "run_losses";
  auto args = tiny_args(run.string());
  for (const char* a : {"training.loss.kind=huber", "training.loss.huber_delta=0.05",
                        "training.loss.forces_mode=vector",
                        "training.loss.config_type_weights={Default: 2.0}",
                        "training.loss.schedule=step", "training.loss.schedule_start=1",
                        "training.loss.energy_weight_final=10",
                        "training.optimizer.name=sgd", "training.optimizer.momentum=0.9",
                        "training.optimizer.no_weight_decay=embedding",
                        "training.scheduler.name=step", "training.scheduler.step_size=2"})
    args.push_back(a);
  Result r = run_crucible(dir_, args);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(1→10, step over epochs 1..1)·Huber(δ=0.05) energy(per atom)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Huber(δ=0.05) forces(per-atom norm)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config_type weights Default 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer  sgd lr"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step lr ×0.5 every 2 steps"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(run / "summary.json"));
}

TEST_F(CliTest, TrainWithCanonicalUpdateHooks) {
  // 10 structures, batch 4: 3 batches per epoch; 2 epochs with 2 batches per
  // optimizer step = ceil(2 * 3 / 2) = 3 steps.
  const fs::path run = dir_ / "run_update_hooks";
  auto args = tiny_args(run.string());
  for (const char* a : {"training.gradient_accumulation_steps=2",
                        "training.spike_skipping.enabled=true", "training.ema.enabled=true"})
    args.push_back(a);
  Result r = run_crucible(dir_, args);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("3 steps (3 batches/epoch, batch_size 4, 2 batches/step, 2 epochs)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("spike skipping k 10 window 50 min_history 10; EMA decay 0.999"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("3 steps, 2 epochs, 0 skipped steps"), std::string::npos) << r.out;
  const std::string summary = read_text(run / "summary.json");
  EXPECT_NE(summary.find("\"steps\": 3"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"skipped_steps\": 0"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"ema_updates\": 3"), std::string::npos) << summary;
  // Validation and model.pt use the average (use_for_validation defaults to true).
  EXPECT_NE(summary.find("\"model_weights\": \"ema\""), std::string::npos) << summary;
  EXPECT_NE(r.out.find("(validation and model.pt use it)"), std::string::npos) << r.out;
  // model.pt holds the average: evaluating it reproduces the final validation.
  const fs::path metrics_json = dir_ / "eval_ema.json";
  r = run_crucible(dir_, {"evaluate", "--model", run.string(), "--data",
                          (dir_ / "tiny_valid.xyz").string(), "--json", metrics_json.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const auto eval = nlohmann::json::parse(read_text(metrics_json));
  const auto v = nlohmann::json::parse(summary).at("validation");
  for (const char* k : {"energy_mae", "forces_mae"}) {
    const double b = v.at(k).get<double>();
    EXPECT_NEAR(eval.at(k).get<double>(), b, 1e-6 * std::max(1.0, std::abs(b))) << k;
  }
}

TEST_F(CliTest, DefaultRunDirectoryIsTimestampedUnderRuns) {
  const fs::path cwd = dir_ / "cwd";
  fs::create_directories(cwd);
  auto args = tiny_args("x");
  args.pop_back();  // no output.run_dir
  args.push_back("training.num_epochs=1");  // a later override of a key wins
  Result r = run_crucible(cwd, args);
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(fs::is_directory(cwd / "runs"));
  int finished = 0;
  for (const auto& e : fs::directory_iterator(cwd / "runs")) {
    EXPECT_TRUE(std::regex_match(e.path().filename().string(),
                                 std::regex("[0-9]{8}-[0-9]{6}(-[0-9]+)?")))
        << e.path();
    finished += fs::exists(e.path() / "summary.json");
  }
  EXPECT_EQ(finished, 1);
}

struct Malformed {
  const char* name;
  std::function<std::string(const std::vector<std::string>&)> make;
  int line;  // expected line number in the message (0 = any)
};

/// Lines of a frame.
std::vector<std::string> lines_of(const std::string& frame) {
  std::vector<std::string> out;
  std::istringstream in(frame);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

TEST_F(CliTest, MalformedDataFailsBeforeRunDirectory) {
  const auto frames = frames_of((dir_ / "tiny.xyz").string());
  ASSERT_GE(frames.size(), 3u);
  // Frames 0 and 1 have 2 atoms each (lines 1-4 and 5-8 of the file).
  const std::string good2 = frames[0] + frames[1];
  const int third = static_cast<int>(lines_of(good2).size()) + 1;  // count line of frame 3
  std::vector<Malformed> cases = {
      {"truncated",
       [&](const std::vector<std::string>& f) {
         auto l = lines_of(f[2]);
         l.pop_back();
         return good2 + join_lines(l);
       },
       0},
      {"non_numeric",
       [&](const std::vector<std::string>& f) {
         auto l = lines_of(f[2]);
         std::istringstream in(l[2]);
         std::string sym, x;
         in >> sym >> x;
         l[2].replace(l[2].find(x), x.size(), "abc");
         return good2 + join_lines(l);
       },
       third + 2},
      {"missing_pos_column",
       [&](const std::vector<std::string>& f) {
         auto l = lines_of(f[2]);
         const auto p = l[1].find("pos:R:3:");
         l[1].erase(p, 8);
         return good2 + join_lines(l);
       },
       third + 1},
      {"short_row",
       [&](const std::vector<std::string>& f) {
         auto l = lines_of(f[2]);
         std::istringstream in(l[3]);
         std::string sym, x, y;
         in >> sym >> x >> y;  // species and two of three coordinates
         l[3] = sym + " " + x + " " + y;
         return good2 + join_lines(l);
       },
       third + 3},
      {"atom_count_mismatch",
       [&](const std::vector<std::string>& f) {
         auto l = lines_of(f[2]);
         l[0] = std::to_string(std::stoi(l[0]) + 5);
         return good2 + join_lines(l);
       },
       0},
  };
  std::vector<std::string> frame_texts(frames.begin(), frames.end());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path file = dir_ / (std::string("bad_") + c.name + ".xyz");
    write_text(file, c.make(frame_texts));
    const fs::path run = dir_ / (std::string("run_bad_") + c.name);
    Result r = run_crucible(dir_, {"train", "data.train_file=" + file.string(),
                                   "training.num_epochs=1", "output.run_dir=" + run.string()});
    EXPECT_EQ(r.rc, 1) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("crucible: error: ", 0), 0u) << r.err;
    const std::string name = file.filename().string();
    const std::regex with_line(std::regex_replace(name, std::regex("\\."), "\\.") + ":[0-9]+: ");
    EXPECT_TRUE(std::regex_search(r.err, with_line)) << r.err;
    if (c.line > 0) {
      EXPECT_NE(r.err.find(name + ":" + std::to_string(c.line) + ":"), std::string::npos) << r.err;
    }
    EXPECT_FALSE(fs::exists(run)) << "run directory created for bad input";
    EXPECT_FALSE(fs::exists(run / "summary.json"));
  }
}

TEST_F(CliTest, EthanolTrainsOneEpochWithBundledConfig) {
  const fs::path run = dir_ / "run_ethanol";
  Result r = run_crucible(dir_, {"train", "--config",
                                 std::string(CRUCIBLE_SOURCE_DIR) + "/configs/ethanol.yaml",
                                 "training.num_epochs=1", "output.run_dir=" + run.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("kcal/mol"), std::string::npos) << r.out;
  const auto summary = nlohmann::json::parse(read_text(run / "summary.json"));
  const auto& v = summary.at("validation");
  EXPECT_TRUE(std::isfinite(v.at("energy_mae").get<double>()));
  EXPECT_TRUE(std::isfinite(v.at("forces_mae").get<double>()));
  EXPECT_TRUE(v.at("stress_mae").is_null());  // no stress in the data
  EXPECT_EQ(v.at("num_stresses").get<int>(), 0);
  const auto model = nlohmann::json::parse(read_text(run / "model.json"));
  EXPECT_EQ(model.at("data").at("energy_unit"), "kcal/mol");
  EXPECT_EQ(model.at("elements"), nlohmann::json({"H", "C", "O"}));
}

}  // namespace
}  // namespace crucible
