#pragma once
// Helpers of the end-to-end suites in tests/cli: run the `crucible` binary
// and read or write the files of a run.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace crucible::e2e {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out, err;
};

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A fresh, empty directory <temp>/<name>_<pid> (an old one is removed).
/// @throws std::filesystem::filesystem_error when it cannot be made.
inline fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

/// How many times `what` occurs in `text`, without overlaps.
inline size_t count_occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Runs `crucible <args>` in `cwd`; captures stdout, stderr and the exit code.
inline Result run_crucible(const fs::path& cwd, const std::vector<std::string>& args) {
  const fs::path err_file = cwd / ("stderr_" + std::to_string(::getpid()) + ".txt");
  std::string cmd = "cd " + shell_quote(cwd.string()) + " && " + shell_quote(CRUCIBLE_BINARY);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " 2>" + shell_quote(err_file.string());
  Result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_text(err_file);
  fs::remove(err_file);
  return r;
}

/// Frames of an extxyz file as text blocks.
inline std::vector<std::string> frames_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> frames;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const int n = std::stoi(line);
    std::string frame = line + "\n";
    for (int i = 0; i < n + 1 && std::getline(in, line); ++i) frame += line + "\n";
    frames.push_back(frame);
  }
  return frames;
}

inline void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

/// A fresh temporary directory `<tmp>/<name>_<pid>` with tiny.xyz (TiAl
/// frames 0-9 of the bundled file) and tiny_valid.xyz (frames 10-13).
/// Returns false if the bundled file has fewer than 14 frames.
inline bool make_tiny_tial_dir(const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto frames = frames_of(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
  if (frames.size() < 14) return false;
  std::string train, valid;
  for (size_t i = 0; i < 10; ++i) train += frames[i];
  for (size_t i = 10; i < 14; ++i) valid += frames[i];
  write_text(dir / "tiny.xyz", train);
  write_text(dir / "tiny_valid.xyz", valid);
  return true;
}

/// Replaces the first `from` in `path` by `to`; false if `from` is absent.
inline bool replace_in_file(const fs::path& path, const std::string& from, const std::string& to) {
  std::string text = read_text(path);
  const auto p = text.find(from);
  if (p == std::string::npos) return false;
  text.replace(p, from.size(), to);
  write_text(path, text);
  return true;
}

}  // namespace crucible::e2e
