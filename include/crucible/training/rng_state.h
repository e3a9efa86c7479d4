#pragma once
// The global random generators' states: what a checkpoint's rng.pt holds,
// and a guard that keeps code from drawing from them (issues 5 and 14).

#include <ATen/ATen.h>

#include <map>
#include <string>

namespace crucible {

/// The default CPU generator's state ("cpu", a uint8 tensor) and, in CUDA
/// builds, each visible GPU's default generator ("cuda:<i>"). Never throws.
std::map<std::string, at::Tensor> capture_rng_states();

/// Sets every generator named in `states` (as capture_rng_states names
/// them) that exists in this process; GPUs missing here are skipped (a
/// resume on fewer GPUs). @throws c10::Error for a state of the wrong size.
void restore_rng_states(const std::map<std::string, at::Tensor>& states);

/// Saves the generators' states and restores them on destruction, so the
/// code in between (e.g. building a model copy that initialises random
/// weights) leaves the global random streams as they were.
class PreservedRngState {
 public:
  PreservedRngState() : saved_(capture_rng_states()) {}
  ~PreservedRngState() { restore_rng_states(saved_); }
  PreservedRngState(const PreservedRngState&) = delete;
  PreservedRngState& operator=(const PreservedRngState&) = delete;

 private:
  std::map<std::string, at::Tensor> saved_;
};

}  // namespace crucible
