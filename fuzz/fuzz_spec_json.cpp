// libFuzzer target: the JSON spec loader (config_from_spec_json), as used by
// `crucible spec validate` and by checkpoints' recipe.json. ConfigError is
// the expected answer to bad input; anything else is a finding.
#include "crucible/common/error.h"
#include "crucible/config/config.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)crucible::config_from_spec_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const crucible::ConfigError&) {
  }
  return 0;
}
