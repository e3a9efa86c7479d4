// libFuzzer target: the extxyz reader (read_extxyz_text) on arbitrary bytes.
// A DataError is the expected answer to bad input; anything else (a crash,
// another exception, a sanitizer report, a hang, > rss_limit_mb) is a finding.
#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto frames =
        crucible::read_extxyz_text(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.xyz");
    (void)frames;
  } catch (const crucible::DataError&) {
  }
  return 0;
}
