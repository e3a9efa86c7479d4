#pragma once
// Hooks: user code that runs at named stages of a training run.

#include "crucible/training/stages.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace crucible {

class TrainingStrategy;
class EnergyModel;
struct Batch;
struct LossOutput;
struct ModelOutputs;
struct ValidationSummary;
class PrecisionPlugin;
class LrScheduler;
class DataLoader;

/// What a hook sees. Pointers are non-owning and valid during the call only;
/// null when not available at that stage (e.g. no batch at SETUP).
///
/// `loss`/`losses` are the live, autograd-connected values from AFTER_LOSS
/// through BEFORE_BACKWARD (a DO_BACKWARD owner may replace `loss`), and
/// detached copies from AFTER_BACKWARD on (so logging never retains graphs).
struct TrainContext {
  TrainingStrategy* strategy = nullptr;
  const Batch* batch = nullptr;
  EnergyModel* model = nullptr;              ///< the primary ("main") model.
  /// Every model of the strategy by name (a single model is "main").
  std::map<std::string, EnergyModel*> models;
  const ModelOutputs* predictions = nullptr; ///< from AFTER_FORWARD on.
  at::Tensor loss;                           ///< scalar total loss.
  const LossOutput* losses = nullptr;        ///< total and components.
  std::vector<torch::optim::Optimizer*> optimizers;
  /// Learning-rate scheduler of each optimizer, paired by index with
  /// `optimizers` (null = none; may be shorter). Per-step schedulers are
  /// stepped after their optimizer's step ran (seed 001); metric-driven ones
  /// by the strategy after validation.
  std::vector<LrScheduler*> lr_schedulers;
  const ValidationSummary* validation = nullptr;  ///< last validation, if any.
  int64_t step_count = 0;         ///< optimizer steps taken.
  int64_t global_step_count = 0;  ///< steps × world size.
  int64_t batch_count = 0;        ///< batches processed (skipped steps included).
  int64_t epoch_count = 0;        ///< completed epochs.
  int64_t epoch_step_count = 0;   ///< batches processed in the current epoch.
  int global_rank = 0;
  /// Set by a DO_OPTIMIZER_STEP owner that vetoed the step (then
  /// step_count does not advance and AFTER_OPTIMIZER_STEP sees true).
  bool optimizer_step_skipped = false;
  /// The run's precision plugin (null when the strategy has none): hooks that
  /// touch gradients (clipping) call precision->unscale_gradients first.
  PrecisionPlugin* precision = nullptr;
  /// SETUP of run() only (seed 002 `active_dataloader`): the loader the run
  /// will train on, the one passed to run() unless an earlier SETUP hook
  /// replaced it. A SETUP hook may point it at another loader (which must
  /// outlive the run); run() then trains on that one. Null elsewhere.
  DataLoader* active_dataloader = nullptr;
};

/// The tensors a training backward fills: every parameter of ctx.models
/// that requires grad, each once (models may share parameters), in the
/// models' name order. Never throws.
std::vector<at::Tensor> trainable_parameters(const TrainContext& ctx);
/// The same for one model: its parameters that require grad. Never throws.
std::vector<at::Tensor> trainable_parameters(EnergyModel& model);

/// A hook. Subclasses say which stages they run on and how often.
///
/// Dispatch: at each stage the strategy calls, in registration order, every
/// hook with `runs_on_stage(stage)` and `step_count % frequency() == 0`.
/// `enter()` is called for all hooks before a run, `exit()` in reverse order
/// after it, also when the run throws.
class Hook {
 public:
  virtual ~Hook() = default;
  /// Name used in messages.
  virtual std::string name() const = 0;
  /// Whether the hook runs at `stage`.
  virtual bool runs_on_stage(TrainingStage stage) const = 0;
  /// Runs every `frequency()` optimizer steps (>= 1). Default 1.
  virtual int64_t frequency() const { return 1; }
  /// The hook body.
  virtual void operator()(TrainContext& ctx, TrainingStage stage) = 0;
  /// Called before a run starts.
  virtual void enter() {}
  /// Called after a run ends; `failed` is true when it ended with an exception.
  virtual void exit(bool failed) { (void)failed; }
  /// Called once by TrainingStrategy::close() (seed 002: hooks with a
  /// close() are closed when the strategy is): release files, handles.
  /// Default: nothing.
  virtual void close() {}
  /// True if this hook must run after the update orchestrator at `stage`
  /// (it observes post-step state, e.g. EMA).
  virtual bool requires_update_orchestrator_before(TrainingStage stage) const {
    (void)stage;
    return false;
  }
  /// Checks dependencies against every registered hook; throws ConfigError.
  virtual void validate_registered_hooks(const std::vector<std::shared_ptr<Hook>>& hooks) const {
    (void)hooks;
  }
  /// The hook's state for a checkpoint (issue 5): name → tensor (any dtype,
  /// CPU or not); empty for a stateless hook (the default).
  virtual std::map<std::string, at::Tensor> hook_state() const { return {}; }
  /// Restores a hook_state(). Default: accepts only an empty state.
  /// @throws std::invalid_argument for a state the hook cannot take.
  virtual void load_hook_state(const std::map<std::string, at::Tensor>& state);
};

/// Calls `enter()` on every hook in order. If one throws, the hooks already
/// entered are exited in reverse order with `failed = true` (their own
/// exceptions swallowed) and the exception is rethrown. `Hooks` is any range
/// of (smart) pointers to Hook subclasses.
template <class Hooks>
void enter_in_order(const Hooks& hooks) {
  size_t entered = 0;
  try {
    for (; entered < hooks.size(); ++entered) hooks[entered]->enter();
  } catch (...) {
    for (size_t i = entered; i-- > 0;) {
      try {
        hooks[i]->exit(true);
      } catch (...) {
      }
    }
    throw;
  }
}

/// Calls `exit(failed)` on every hook in reverse order, even when one throws;
/// afterwards rethrows the first exception if `rethrow`.
template <class Hooks>
void exit_in_reverse(const Hooks& hooks, bool failed, bool rethrow) {
  std::exception_ptr first;
  for (size_t i = hooks.size(); i-- > 0;) {
    try {
      hooks[i]->exit(failed);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first && rethrow) std::rethrow_exception(first);
}

/// A hook from a function, for tests and small user additions.
class LambdaHook : public Hook {
 public:
  using Fn = std::function<void(TrainContext&, TrainingStage)>;
  /// @throws std::invalid_argument if frequency < 1 or `fn` is empty.
  LambdaHook(std::string name, std::set<TrainingStage> stages, Fn fn, int64_t frequency = 1);
  std::string name() const override { return name_; }
  bool runs_on_stage(TrainingStage stage) const override { return stages_.count(stage) > 0; }
  int64_t frequency() const override { return frequency_; }
  void operator()(TrainContext& ctx, TrainingStage stage) override { fn_(ctx, stage); }

 private:
  std::string name_;
  std::set<TrainingStage> stages_;
  Fn fn_;
  int64_t frequency_;
};

}  // namespace crucible
