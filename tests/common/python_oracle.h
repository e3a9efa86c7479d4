#pragma once
// Running the independent Python oracles (ASE, PyTorch) from a test.
// CRUCIBLE_PYTHON is /usr/bin/python3 by default (Debian's python3-ase and
// python3-torch); tests skip with a message when a module is missing.

#include <cstdio>
#include <cstdlib>
#include <string>

namespace crucible::testing {

/// Runs `CRUCIBLE_PYTHON <args>` and returns its stdout; "" if it could not
/// start or exited non-zero (stderr is discarded).
inline std::string run_python(const std::string& args) {
  const std::string cmd = std::string(CRUCIBLE_PYTHON) + " " + args + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return "";
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  return pclose(pipe) == 0 ? out : "";
}

/// True when CRUCIBLE_PYTHON can import `modules` (comma-separated).
inline bool python_has(const std::string& modules) {
  const std::string cmd =
      std::string(CRUCIBLE_PYTHON) + " -c 'import " + modules + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

}  // namespace crucible::testing
