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

}  // namespace crucible::e2e
