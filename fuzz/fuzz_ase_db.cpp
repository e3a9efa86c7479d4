// libFuzzer target: the ASE database reader (read_ase_db) on arbitrary bytes, issue 18.
// The bytes go to one temporary file per process (SQLite opens a path);
// a DataError is the expected answer to bad input, anything else a finding.
#include "crucible/common/error.h"
#include "crucible/data/ase_db.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/crucible_fuzz_db_" + std::to_string(::getpid()) + ".db";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    (void)crucible::read_ase_db(path);
  } catch (const crucible::DataError&) {
  }
  return 0;
}
