// Issue 6 end to end: `crucible train --nproc 2` (two processes, Gloo over
// loopback) against one process with twice the batch, and a killed worker.

#include "crucible/run/model_io.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <thread>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace crucible {
namespace {

struct Result {
  int rc = -1;
  std::string out, err;
  double seconds = 0;
};

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Runs `env crucible args...` in `cwd`.
Result run(const fs::path& cwd, const std::string& env, const std::vector<std::string>& args) {
  const fs::path err_file = cwd / "stderr.txt";
  std::string cmd = "cd " + quote(cwd.string()) + " && " + env + " " + quote(CRUCIBLE_BINARY);
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " 2>" + quote(err_file.string());
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_text(err_file);
  return r;
}

class NprocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("crucible_nproc_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  /// Ethanol (9 atoms per frame, so per-batch means average exactly), float64.
  std::vector<std::string> args(const std::string& run, int batch, int steps) {
    return {"train",
            "--config",
            std::string(CRUCIBLE_SOURCE_DIR) + "/configs/ethanol.yaml",
            "training.dtype=float64",
            "training.num_steps=" + std::to_string(steps),
            "training.batch_size=" + std::to_string(batch),
            "training.validate_every_n_epochs=0",
            "model.schnet.hidden_channels=16",
            "model.schnet.num_filters=16",
            "model.schnet.num_interactions=2",
            "output.run_dir=" + (dir_ / run).string()};
  }
  fs::path dir_;
};

/// Largest weight difference of two saved runs, and the largest weight.
std::pair<double, double> weight_difference(const fs::path& one, const fs::path& two) {
  auto a = load_model(one.string());
  auto b = load_model(two.string());
  const auto pa = a.model->module().named_parameters();
  const auto pb = b.model->module().named_parameters();
  EXPECT_EQ(pa.size(), pb.size());
  double max_diff = 0, max_moved = 0;
  for (const auto& item : pa) {
    max_diff = std::max(max_diff, (item.value() - pb[item.key()]).abs().max().item<double>());
    max_moved = std::max(max_moved, item.value().abs().max().item<double>());
  }
  return {max_diff, max_moved};
}

TEST_F(NprocTest, TwoWorkersWithBatchBMatchOneWorkerWithBatch2BAfter20Steps) {
  Result one = run(dir_, "", args("one", 4, 20));
  ASSERT_EQ(one.rc, 0) << one.out << one.err;
  auto two_args = args("two", 2, 20);
  two_args.insert(two_args.begin() + 1, {"--nproc", "2"});
  Result two = run(dir_, "", two_args);
  ASSERT_EQ(two.rc, 0) << two.out << two.err;
  // Only rank 0 prints and writes.
  EXPECT_EQ(two.out.find("crucible train\n"), two.out.rfind("crucible train\n")) << two.out;

  auto a = load_model((dir_ / "one").string());
  auto b = load_model((dir_ / "two").string());
  const auto pa = a.model->module().named_parameters();
  const auto pb = b.model->module().named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  double max_diff = 0, max_moved = 0;
  for (const auto& item : pa) {
    const at::Tensor& x = item.value();
    const at::Tensor& y = pb[item.key()];
    max_diff = std::max(max_diff, (x - y).abs().max().item<double>());
  }
  // The runs moved the weights (else agreement would be trivial).
  const auto first_steps = nlohmann::json::parse(read_text(dir_ / "one" / "summary.json"));
  EXPECT_EQ(first_steps.at("steps"), 20);
  for (const auto& item : pa) max_moved = std::max(max_moved, item.value().abs().max().item<double>());
  EXPECT_GT(max_moved, 0.0);
  EXPECT_LT(max_diff, 1e-9) << "2 workers x batch 2 vs 1 worker x batch 4, float64";
  const auto sa = nlohmann::json::parse(read_text(dir_ / "one" / "summary.json"))["validation"];
  const auto sb = nlohmann::json::parse(read_text(dir_ / "two" / "summary.json"))["validation"];
  EXPECT_NEAR(sa["forces_mae"].get<double>(), sb["forces_mae"].get<double>(), 1e-6);
  EXPECT_EQ(sa["num_structures"], sb["num_structures"]) << "validation sums over both shards";
}

// Issue 16: the same with MACE (its fused kernels and symmetric
// contraction under c10d gradient averaging), 10 steps.
TEST_F(NprocTest, MaceTwoWorkersWithBatchBMatchOneWorkerWithBatch2B) {
  auto mace = [&](const std::string& run, int batch) {
    auto a = args(run, batch, 10);
    a.erase(std::remove_if(a.begin(), a.end(), [](const std::string& x) { return x.rfind("model.schnet.", 0) == 0; }),
            a.end());
    for (const char* k : {"model.type=mace", "model.mace.hidden_irreps=4x0e+4x1o", "model.mace.max_ell=2",
                          "model.mace.radial_mlp=[8]", "model.mace.num_bessel=4"})
      a.push_back(k);
    return a;
  };
  Result one = run(dir_, "", mace("mace_one", 4));
  ASSERT_EQ(one.rc, 0) << one.out << one.err;
  auto two_args = mace("mace_two", 2);
  two_args.insert(two_args.begin() + 1, {"--nproc", "2"});
  Result two = run(dir_, "", two_args);
  ASSERT_EQ(two.rc, 0) << two.out << two.err;
  const auto [max_diff, max_moved] = weight_difference(dir_ / "mace_one", dir_ / "mace_two");
  EXPECT_GT(max_moved, 0.0);
  EXPECT_LT(max_diff, 1e-9) << "MACE: 2 workers x batch 2 vs 1 worker x batch 4, float64";
}

TEST_F(NprocTest, AKilledWorkerMakesTheOtherExitNonZeroWithinTheTimeout) {
  auto a = args("killed", 2, 200);
  a.insert(a.begin() + 1, {"--nproc", "2"});
  a.push_back("training.distributed.timeout_s=10");
  Result r = run(dir_, "CRUCIBLE_FAULT_KILL_AT_BATCH=1:3", a);
  EXPECT_NE(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("worker rank 1 was killed by signal 9"), std::string::npos) << r.err;
  // Rank 0's own error names the silent worker.
  EXPECT_NE(r.err.find("rank 0 of 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("worker rank 1 stopped answering"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 60.0) << "the survivor must stop within timeout_s, not hang";
  EXPECT_EQ(r.err.find("did not stop in time"), std::string::npos) << r.err;
}

TEST_F(NprocTest, TwoWorkerRunStoppedBySigtermResumesWithOneWorker) {
  auto a = args("resize", 2, 30);
  a.insert(a.begin() + 1, {"--nproc", "2"});
  Result r = run(dir_, "CRUCIBLE_FAULT_SIGTERM_AT_BATCH=3", a);
  ASSERT_EQ(r.rc, 143) << r.out << r.err;  // the workers' 128 + SIGTERM, passed on
  EXPECT_EQ(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("stopped by a signal"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "resize" / "summary.json"));
  r = run(dir_, "", {"train", "--resume", (dir_ / "resize").string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resuming from checkpoint"), std::string::npos) << r.out;
  const auto summary = nlohmann::json::parse(read_text(dir_ / "resize" / "summary.json"));
  EXPECT_EQ(summary.at("steps"), 30);
}

// Issue 15: a worker that dies during start-up (before every worker joined
// the process group) is reported at once, not after the others' timeouts.
TEST_F(NprocTest, AWorkerDyingAtStartUpIsReportedWithinTheTimeout) {
  auto a = args("startup", 2, 20);
  a.insert(a.begin() + 1, {"--nproc", "2"});
  a.push_back("training.distributed.timeout_s=30");
  Result r = run(dir_, "CRUCIBLE_FAULT_EXIT_AT_START=1", a);
  EXPECT_NE(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("worker rank 1 exited with code 1 during start-up"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 30.0) << "reported within training.distributed.timeout_s";
  EXPECT_EQ(r.err.find("did not stop in time"), std::string::npos) << r.err;
}

/// PIDs of processes whose command line contains `needle` (from /proc).
std::vector<int> processes_with(const std::string& needle) {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos && std::stoi(name) != ::getpid()) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

// Issue 15: kill -9 of the launcher takes its workers with it.
TEST_F(NprocTest, WorkersDieWithAKilledLauncher) {
  auto a = args("orphans", 2, 100000);
  a.insert(a.begin() + 1, {"--nproc", "2"});
  const std::string marker = (dir_ / "orphans").string();
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    std::vector<char*> argv{const_cast<char*>(CRUCIBLE_BINARY)};
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(CRUCIBLE_BINARY, argv.data());
    ::_exit(127);
  }
  // Wait until both workers train (rank 0 writes metrics.csv).
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(dir_ / "orphans" / "metrics.csv") &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(fs::exists(dir_ / "orphans" / "metrics.csv"));
  EXPECT_EQ(processes_with(marker).size(), 3u);  // the launcher and two workers
  ::kill(launcher, SIGKILL);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const auto left = processes_with(marker);
  EXPECT_TRUE(left.empty()) << left.size() << " worker(s) still alive 5 s after the launcher died";
  for (int pid : left) ::kill(pid, SIGKILL);
}

}  // namespace
}  // namespace crucible
