#include "crucible/training/hook.h"

#include <stdexcept>

namespace crucible {

LambdaHook::LambdaHook(std::string name, std::set<TrainingStage> stages, Fn fn, int64_t frequency)
    : name_(std::move(name)), stages_(std::move(stages)), fn_(std::move(fn)), frequency_(frequency) {
  if (frequency_ < 1) {
    throw std::invalid_argument("hook '" + name_ + "': frequency must be >= 1, got " +
                                std::to_string(frequency_));
  }
  if (!fn_) throw std::invalid_argument("hook '" + name_ + "': fn must be callable, got empty");
}

void Hook::load_hook_state(const std::map<std::string, at::Tensor>& state) {
  if (!state.empty()) {
    throw std::invalid_argument("hook '" + name() + "' has no state to restore, got " +
                                std::to_string(state.size()) + " entries");
  }
}

}  // namespace crucible
