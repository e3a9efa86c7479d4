#include "crucible/training/hook.h"

#include "crucible/models/energy_model.h"

#include <set>
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

std::vector<at::Tensor> trainable_parameters(EnergyModel& model) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model.module().parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

std::vector<at::Tensor> trainable_parameters(const TrainContext& ctx) {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  auto add = [&](EnergyModel* m) {
    if (m == nullptr) return;
    for (const at::Tensor& p : trainable_parameters(*m)) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    }
  };
  for (const auto& [name, m] : ctx.models) add(m);
  add(ctx.model);
  return out;
}

void Hook::load_hook_state(const std::map<std::string, at::Tensor>& state) {
  if (!state.empty()) {
    throw std::invalid_argument("hook '" + name() + "' has no state to restore, got " +
                                std::to_string(state.size()) + " entries");
  }
}

}  // namespace crucible
