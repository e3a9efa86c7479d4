// libFuzzer target: the .npy reader (read_npy) on arbitrary bytes, issue 18.
// The bytes go to one temporary file per process (read_npy reads a path);
// a DataError is the expected answer to bad input, anything else a finding.
#include "crucible/common/error.h"
#include "crucible/data/npy.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/crucible_fuzz_npy_" + std::to_string(::getpid()) + ".npy";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    (void)crucible::read_npy(path);
  } catch (const crucible::DataError&) {
  }
  return 0;
}
