// libFuzzer target: the checkpoint manifest reader (parse_manifest), which
// decides which files of a checkpoint directory are read. DataError is the
// expected answer to bad input; anything else is a finding. Every entry it
// accepts must name a canonical checkpoint folder and plain relative file
// names (no '..', no absolute path): checked here too.
#include "checkpoint/manifest.h"
#include "crucible/common/error.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto entries = crucible::checkpoint::detail::parse_manifest(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz/manifest.json");
    for (const auto& e : entries) {
      if (!crucible::checkpoint::detail::parse_dir_name(e.dir)) std::abort();
      for (const auto& f : e.files) {
        if (f.name.empty() || f.name[0] == '/' || f.name.find("..") != std::string::npos) std::abort();
      }
    }
  } catch (const crucible::DataError&) {
  }
  return 0;
}
