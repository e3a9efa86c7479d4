#pragma once
// EmaHook: exponential moving average of the model's weights (seed 002's EMA
// inference model, driven as a seed 001 update hook).

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crucible/training/update_hook.h"

namespace crucible {

/// Options of EmaHook.
struct EmaOptions {
  /// Weight of the old average: in [0, 1). Default 0.999.
  double decay = 0.999;
  /// Update every n-th optimizer step: >= 1. Default 1.
  int64_t update_every = 1;
  /// First optimizer step (1-based) that may update: >= 0. Default 0.
  int64_t start_step = 0;
  /// torch_ema's use_num_updates, which MACE uses: update k (1-based)
  /// averages with min(decay, (1 + k)/(10 + k)), so early averages follow
  /// the weights closely (0.99 is reached at k = 890). The one difference
  /// from torch_ema: the average starts at the weights after the first
  /// update, not before it (there their weight is 2/11 · 3/12 · ..., below
  /// 1e-3 after four updates). Default false (constant decay).
  bool warmup = false;
  /// After each update, copy the average into a clone of the model and
  /// publish it as the strategy's inference model (validation then uses it
  /// when ValidationConfig::use_ema). Default true.
  bool publish_inference_model = true;
};

/// Keeps an exponential moving average ("shadow") of the main model's
/// parameters, and a copy of its buffers.
///
/// At AFTER_OPTIMIZER_STEP, only when the step ran (will_skip false), with
/// s = ctx.step_count + 1 the number of optimizer steps taken including this
/// one: if s >= start_step and s % update_every == 0, the shadow is updated
/// from `ctx.model->module()`:
///  - the first update copies the parameters (torch.optim.swa_utils.
///    AveragedModel semantics: the average starts at the current weights);
///  - later updates: shadow = d · shadow + (1 - d) · param with d = decay,
///    or min(decay, (1 + k)/(10 + k)) for update k with options.warmup;
///  - buffers, and parameters that do not require grad (frozen by
///    training.freeze), are copied, never averaged (d·p + (1 - d)·p may
///    round away from p);
/// Shadow tensors are detached clones with the parameters' dtype/device.
/// At SETUP, an average restored by load_state_dict is published at once
/// (so a resumed run validates with it before its next update).
/// Other stages: nothing. Never vetoes.
///
/// The shadow is kept as named tensors (not a module clone, which LibTorch
/// cannot do generically); copy_to / swap_into put it into a module for
/// validation or export, state_dict / load_state_dict checkpoint it.
///
/// Publishing (seed 002 `set_inference_model`): with
/// options.publish_inference_model and a strategy in the context, each
/// update also copies the average into a clone of the model
/// (EnergyModel::clone_model, made once, parameters frozen) and calls
/// `ctx.strategy->set_inference_model(clone)`; validation then evaluates it.
/// A model whose clone_model() returns null makes that update throw
/// std::logic_error naming the model.
///
/// Ordering: the hook runs inside the update orchestrator, after the
/// optimizer step, so requires_update_orchestrator_before() is not needed
/// (it is for plain hooks that observe post-step weights).
///
/// Priority update_priority::kDefault (50); no exclusive key (several
/// averages with different decays may coexist).
class EmaHook : public TrainingUpdateHook {
 public:
  /// @throws ConfigError "`decay` must be in [0, 1), got <v>",
  ///   "`update_every` must be >= 1, got <n>", "`start_step` must be >= 0, got <n>".
  explicit EmaHook(EmaOptions options = {});

  std::string name() const override { return "EmaHook"; }
  using TrainingUpdateHook::operator();
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;

  /// Updates the shadow from `module` now (the body of one scheduled update).
  void update(torch::nn::Module& module);
  /// The published copy holding the average (null before the first publish).
  std::shared_ptr<EnergyModel> inference_model() const { return inference_; }

  const EmaOptions& options() const { return options_; }
  /// True once the shadow exists (first update or load_state_dict).
  bool initialized() const {
    return !params_.empty() || !buffers_.empty() || !loaded_.empty();
  }
  /// Updates done so far (0 after load_state_dict of a fresh state).
  int64_t num_updates() const { return num_updates_; }
  /// The averaged parameters, by name (as module.named_parameters()).
  const std::vector<std::pair<std::string, at::Tensor>>& shadow_parameters() const {
    return params_;
  }

  /// Copies the shadow parameters and buffers into `module` (no autograd).
  /// @throws std::logic_error if not initialized(); std::invalid_argument if
  ///   a module parameter/buffer has no shadow, or shapes differ (named).
  void copy_to(torch::nn::Module& module) const;
  /// Exchanges the module's weights with the shadow, so the module holds the
  /// average; calling it again restores both. Errors as copy_to.
  void swap_into(torch::nn::Module& module);

  /// Name → tensor (clones): parameters and buffers under their module
  /// names, plus "__ema_num_updates__" (int64 scalar).
  std::map<std::string, at::Tensor> state_dict() const;
  /// Restores a state_dict() (clones). Parameters vs buffers are told apart
  /// at the next use against the module: names are matched then.
  /// @throws std::invalid_argument if "__ema_num_updates__" is missing or a
  ///   tensor is undefined.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);
  /// Checkpoint state: state_dict() / load_state_dict().
  std::map<std::string, at::Tensor> hook_state() const override { return state_dict(); }
  void load_hook_state(const std::map<std::string, at::Tensor>& state) override {
    load_state_dict(state);
  }

 private:
  void resolve_loaded(torch::nn::Module& module) const;
  void publish(TrainContext& ctx);

  EmaOptions options_;
  mutable std::vector<std::pair<std::string, at::Tensor>> params_;
  mutable std::vector<std::pair<std::string, at::Tensor>> buffers_;
  mutable std::map<std::string, at::Tensor> loaded_;  ///< from load_state_dict, unresolved.
  int64_t num_updates_ = 0;
  std::shared_ptr<EnergyModel> inference_;
};

}  // namespace crucible
