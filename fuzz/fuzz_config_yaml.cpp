// libFuzzer target: the YAML config loader (apply_config_yaml, then the
// config validation `crucible train` runs). ConfigError is the expected
// answer to bad input; anything else is a finding.
#include "crucible/common/error.h"
#include "crucible/config/config.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    crucible::Config config = crucible::default_config();
    crucible::apply_config_yaml(config, std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
    crucible::validate_config(config);
  } catch (const crucible::ConfigError&) {
  }
  return 0;
}
