// Global generator states. See include/crucible/training/rng_state.h.

#include "crucible/training/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace crucible {

std::map<std::string, at::Tensor> capture_rng_states() {
  std::map<std::string, at::Tensor> out;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    out["cpu"] = gen.get_state();
  }
  if (at::hasCUDA()) {
    for (size_t i = 0; i < at::getNumGPUs(); ++i) {
      auto gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<int>(i)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      out["cuda:" + std::to_string(i)] = gen.get_state();
    }
  }
  return out;
}

void restore_rng_states(const std::map<std::string, at::Tensor>& states) {
  if (auto it = states.find("cpu"); it != states.end()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second);
  }
  if (at::hasCUDA()) {
    for (size_t i = 0; i < at::getNumGPUs(); ++i) {
      auto it = states.find("cuda:" + std::to_string(i));
      if (it == states.end()) continue;
      auto gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<int>(i)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(it->second);
    }
  }
}

}  // namespace crucible
