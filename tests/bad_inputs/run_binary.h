#pragma once
// Running the real `crucible` binary from the issue-8 tests: exit code,
// stderr and the child's own peak resident memory (wait4).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace crucible::testing {

namespace fs = std::filesystem;

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

struct Outcome {
  int rc = -1;            // exit code; -1 if killed by a signal
  std::string err;        // stderr
  long max_rss_kib = 0;   // peak resident memory of the child
};

/// Runs `crucible <args>` in `cwd` with posix_spawn and wait4; stdout is
/// discarded, stderr captured. `shell_setup` (e.g. "ulimit -f 512") runs in
/// /bin/sh first, which then execs the binary; `env` adds NAME=VALUE pairs.
inline Outcome run_crucible(const fs::path& cwd, const std::vector<std::string>& args,
                            const std::string& shell_setup = "",
                            const std::vector<std::string>& env = {}) {
  const fs::path err_file = cwd / "stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_s;
  if (!shell_setup.empty()) argv_s = {"/bin/sh", "-c", shell_setup + "; exec \"$0\" \"$@\""};
  argv_s.push_back(CRUCIBLE_BINARY);
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  const fs::path old = fs::current_path();
  fs::current_path(cwd);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  fs::current_path(old);
  posix_spawn_file_actions_destroy(&actions);
  Outcome o;
  if (spawned != 0) return o;
  int status = 0;
  struct rusage usage {};
  while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.max_rss_kib = usage.ru_maxrss;
  o.err = read_text(err_file);
  return o;
}

/// A new, empty folder for the running GoogleTest case
/// (TMPDIR/<prefix>_<pid>_<test name>), removed first if it exists.
inline fs::path fresh_test_dir(const std::string& prefix) {
  const fs::path dir = fs::temp_directory_path() /
                       (prefix + "_" + std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// The last non-empty line of `text`.
inline std::string last_line(const std::string& text) {
  std::string line, last;
  std::istringstream in(text);
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

/// The first `count` frames of the bundled TiAl data set, as extxyz text.
inline std::string tial_frames(int count) {
  std::ifstream in(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
  std::string text, line;
  int frames = 0;
  while (frames < count && std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const int n = std::stoi(line);
    text += line + "\n";
    for (int i = 0; i < n + 1 && std::getline(in, line); ++i) text += line + "\n";
    ++frames;
  }
  return text;
}

/// `crucible train` arguments of a small, fast run on `data` into `run_dir`.
inline std::vector<std::string> tiny_training_args(const fs::path& data, const fs::path& run_dir) {
  return {"train", "data.train_file=" + data.string(), "data.valid_fraction=0.2",
          "training.batch_size=4", "model.schnet.hidden_channels=8", "model.schnet.num_filters=8",
          "model.schnet.num_interactions=1", "output.run_dir=" + run_dir.string()};
}

}  // namespace crucible::testing
