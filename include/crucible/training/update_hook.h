#pragma once
// Training-update hooks and the orchestrator that runs them (seed 001:
// TrainingUpdateHook, TrainingUpdateOrchestrator; folding rules from seed 002).
//
// An update hook customises the parameter update of one batch: whether the
// gradients are zeroed (BEFORE_BATCH), which loss backward() runs on
// (DO_BACKWARD), whether and how the optimizers step (DO_OPTIMIZER_STEP), and
// what happens after a step that ran or was skipped (AFTER_OPTIMIZER_STEP).
// Update hooks are never dispatched by the strategy directly: they run inside
// one TrainingUpdateOrchestrator, which is an ordinary Hook and owns the
// zero_grad / backward / optimizer.step calls the strategy otherwise issues.

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crucible/training/hook.h"
#include "crucible/training/stages.h"

namespace crucible {

/// Canonical priorities of update hooks (seed 001): lower runs first inside
/// an orchestrator. Gradient accumulation must see (and veto) a stage before
/// mixed precision unscales, clipping clips, or spike skipping inspects.
namespace update_priority {
inline constexpr int kGradientAccumulation = 10;
inline constexpr int kMixedPrecision = 20;
inline constexpr int kGradientClipping = 30;
inline constexpr int kSpikeSkipping = 40;
inline constexpr int kNonFiniteLossGuard = 45;
inline constexpr int kDefault = 50;
}  // namespace update_priority

/// The stages an orchestrator claims, in the order a batch visits them
/// (seed 001): BEFORE_BATCH, DO_BACKWARD, DO_OPTIMIZER_STEP,
/// AFTER_OPTIMIZER_STEP. SETUP is not among them but is fanned out to every
/// child as well (see TrainingUpdateOrchestrator).
const std::array<TrainingStage, 4>& training_update_stages();

/// True if `stage` is one of training_update_stages().
bool is_training_update_stage(TrainingStage stage);

/// What an update hook returns for one stage dispatch (seed 001's
/// `(proceed, loss)` tuple).
///
/// `proceed`: on BEFORE_BATCH and DO_OPTIMIZER_STEP, false vetoes the gated
/// operation (zero_grad / optimizer step) and later hooks see
/// `will_skip = true`; ignored on the other stages. The seed rejects a
/// non-bool `proceed` at run time (TypeError); here the field's type makes
/// that impossible, so no run-time check exists.
/// `loss`: on DO_BACKWARD the loss the next hook (and finally backward())
/// sees; must be defined there. Ignored (may be undefined) on other stages.
struct UpdateDecision {
  bool proceed = true;
  at::Tensor loss;
};

/// Per-optimizer outcome of an optimizer step owned by an update hook (see
/// TrainingUpdateHook::step_optimizers). `skipped[i]` is true when the step
/// of `ctx.optimizers[i]` did not run (e.g. a gradient scaler found inf/NaN).
struct OptimizerStepReport {
  std::vector<bool> skipped;
  /// True if any optimizer step was skipped; the orchestrator then reports
  /// the whole update as skipped (seed 001: scaler-aware stepping).
  bool any_skipped() const;
};

/// The parameters of every optimizer in `ctx.optimizers` (null entries
/// skipped), each once, in optimizer / param-group order (through
/// `ctx.precision->main_params()` when the run has a plugin, seed 004);
/// defined tensors only. What gradient clipping, spike skipping and gradient averaging
/// iterate over. Never throws.
std::vector<at::Tensor> optimizer_parameters(const TrainContext& ctx);

/// Base class of hooks that customise the training update (seed 001).
///
/// Subclasses override the three-argument `operator()` and dispatch on
/// `stage`. They are called by their orchestrator, in priority order, on
/// SETUP and on every update stage, every batch (`frequency()` is fixed at 1).
/// `will_skip` is a stage-local cumulative veto: true when an earlier hook in
/// the same dispatch has already vetoed the gated operation (BEFORE_BATCH,
/// DO_OPTIMIZER_STEP), or, on AFTER_OPTIMIZER_STEP, when the optimizer step
/// was skipped. Hooks after a veto still run so they can keep bookkeeping,
/// but should avoid side effects that assume the operation runs (e.g. a
/// clipping hook does not clip when `will_skip`).
///
/// Registration: pass the hook to TrainingStrategy::register_hook (bare
/// update hooks are folded into the strategy's one orchestrator) or compose
/// hooks with `+` into an orchestrator first. Calling the two-argument
/// `Hook::operator()` directly throws std::logic_error.
///
/// Extension point for a gradient scaler (seed 001's scaler-aware
/// stepping): a hook whose `owns_optimizer_step()` is true replaces the
/// orchestrator's plain `optimizer.step()` loop with its own
/// `step_optimizers()`; see there.
class TrainingUpdateHook : public Hook {
 public:
  /// Dispatch order inside an orchestrator; lower runs first, ties keep
  /// composition order. Default update_priority::kDefault (50).
  virtual int priority() const { return update_priority::kDefault; }

  /// Hook families that may appear at most once in an orchestrator return a
  /// key (e.g. "MixedPrecisionHook"); default none. A second hook with the
  /// same key makes the orchestrator's constructor throw ConfigError.
  virtual std::optional<std::string> exclusive_update_key() const { return std::nullopt; }

  /// Runs the hook for SETUP or an update stage. Default: {true, ctx.loss}
  /// (proceed, loss unchanged). See UpdateDecision for how the result is used.
  virtual UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip);

  /// True if this hook performs the optimizer steps itself (e.g. through a
  /// gradient scaler that may skip a step with inf/NaN gradients). Asked by
  /// the orchestrator at every DO_OPTIMIZER_STEP that was not vetoed, after
  /// all hooks ran for that stage. At most one child may own the step.
  /// Default false.
  virtual bool owns_optimizer_step() const { return false; }

  /// Steps every optimizer in `ctx.optimizers` (only called when
  /// `owns_optimizer_step()` is true and the step was not vetoed) and
  /// reports per optimizer whether its step was skipped; the report must
  /// have one entry per optimizer. Default: throws std::logic_error.
  virtual OptimizerStepReport step_optimizers(TrainContext& ctx);

  /// SETUP and the update stages: the stages the orchestrator calls it on.
  bool runs_on_stage(TrainingStage stage) const final;
  /// Always 1: the orchestrator calls its children on every batch.
  int64_t frequency() const final { return 1; }
  /// Not callable: update hooks run inside an orchestrator.
  /// @throws std::logic_error always, naming the hook.
  void operator()(TrainContext& ctx, TrainingStage stage) final;
};

/// An update hook from a function, for tests and small user additions.
class LambdaUpdateHook : public TrainingUpdateHook {
 public:
  using Fn = std::function<UpdateDecision(TrainContext&, TrainingStage, bool)>;
  /// @throws std::invalid_argument if `fn` is empty.
  LambdaUpdateHook(std::string name, Fn fn, int priority = update_priority::kDefault,
                   std::optional<std::string> exclusive_key = std::nullopt);
  std::string name() const override { return name_; }
  int priority() const override { return priority_; }
  std::optional<std::string> exclusive_update_key() const override { return exclusive_key_; }
  using TrainingUpdateHook::operator();
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override {
    return fn_(ctx, stage, will_skip);
  }

 private:
  std::string name_;
  Fn fn_;
  int priority_;
  std::optional<std::string> exclusive_key_;
};

/// Composes update hooks and drives the training update (seed 001).
///
/// Children are held stably sorted by priority (ties keep composition
/// order); nested orchestrators are flattened into their children.
///
/// Dispatch by stage:
/// - SETUP: every child is called with will_skip = false (seed 002 fans
///   SETUP out to the orchestrator so children can initialise state).
/// - BEFORE_BATCH: every child is called with the cumulative will_skip (any
///   veto wins); unless vetoed, `zero_grad()` on every optimizer in
///   `ctx.optimizers` (gradient accumulation vetoes to keep gradients).
/// - DO_BACKWARD: the loss is threaded through the children (each sees
///   `ctx.loss` as its predecessor returned it), then backward runs once
///   on the final `ctx.loss`: `ctx.precision->backward()` and
///   `post_backward()` when the run has a precision plugin (seed 004), else
///   `ctx.loss.backward()`. A ×0.5 hook followed by a ×2 hook leaves the
///   loss, hence the gradients, unchanged.
/// - DO_OPTIMIZER_STEP: gating as on BEFORE_BATCH; unless vetoed, the
///   optimizers step (through the owning child's `step_optimizers()` if one
///   owns the step, else `ctx.precision->optimizer_step()` on each, or
///   `step()` without a plugin) and then `ctx.lr_schedulers` through
///   step_lr_schedulers: only the per-step scheduler of an optimizer whose
///   step ran (metric-driven ones never step here). Sets
///   `optimizer_step_skipped()` and `ctx.optimizer_step_skipped` to true if
///   vetoed or any owned step was skipped.
/// - AFTER_OPTIMIZER_STEP: every child is called with will_skip =
///   optimizer_step_skipped().
/// - other stages: nothing (the orchestrator does not claim them).
/// `enter()` / `exit()` are fanned out to the children (exit in reverse).
class TrainingUpdateOrchestrator : public Hook {
 public:
  /// `parts`: update hooks and/or orchestrators (flattened), any number.
  /// @throws ConfigError if a part is null or neither a TrainingUpdateHook
  ///         nor a TrainingUpdateOrchestrator, if two children share an
  ///         exclusive key, or if more than one child owns the optimizer step.
  explicit TrainingUpdateOrchestrator(const std::vector<std::shared_ptr<Hook>>& parts = {});

  std::string name() const override { return "TrainingUpdateOrchestrator"; }
  /// SETUP and the four update stages.
  bool runs_on_stage(TrainingStage stage) const override;
  int64_t frequency() const override { return 1; }
  /// See the class comment for per-stage behaviour.
  /// @throws std::logic_error if a child returns an undefined loss on
  ///         DO_BACKWARD (naming the child and stage), ctx.loss is undefined
  ///         there, more than one child owns the step at run time, a step
  ///         owner's report has the wrong size, or an optimizer is null.
  void operator()(TrainContext& ctx, TrainingStage stage) override;
  /// Enters every child in order; if one throws, exits the entered ones
  /// (failed = true) in reverse and rethrows.
  void enter() override;
  /// Exits every child in reverse order; rethrows the first exception after
  /// all children exited.
  void exit(bool failed) override;
  /// Seed 001 close(): closes every child in reverse order; rethrows the
  /// first exception after all children were closed.
  void close() override;

  /// Children in dispatch order.
  const std::vector<std::shared_ptr<TrainingUpdateHook>>& hooks() const { return hooks_; }
  /// Whether the most recent DO_OPTIMIZER_STEP was vetoed or skipped.
  bool optimizer_step_skipped() const { return optimizer_step_skipped_; }

 private:
  bool run_gated_stage(TrainContext& ctx, TrainingStage stage);
  bool step(TrainContext& ctx);

  std::vector<std::shared_ptr<TrainingUpdateHook>> hooks_;
  bool optimizer_step_skipped_ = false;
};

/// Composition (seed 001 `+`): an orchestrator holding both operands'
/// hooks, nested orchestrators flattened, sorted by priority.
/// @throws ConfigError as TrainingUpdateOrchestrator's constructor.
std::shared_ptr<TrainingUpdateOrchestrator> operator+(const std::shared_ptr<TrainingUpdateHook>& a,
                                                      const std::shared_ptr<TrainingUpdateHook>& b);
std::shared_ptr<TrainingUpdateOrchestrator> operator+(
    const std::shared_ptr<TrainingUpdateOrchestrator>& a,
    const std::shared_ptr<TrainingUpdateHook>& b);
std::shared_ptr<TrainingUpdateOrchestrator> operator+(
    const std::shared_ptr<TrainingUpdateHook>& a,
    const std::shared_ptr<TrainingUpdateOrchestrator>& b);
std::shared_ptr<TrainingUpdateOrchestrator> operator+(
    const std::shared_ptr<TrainingUpdateOrchestrator>& a,
    const std::shared_ptr<TrainingUpdateOrchestrator>& b);

/// The registered set as hooks validate it (seed 002 `_iter_registered_hooks`):
/// each hook, followed by an orchestrator's children right after it.
std::vector<std::shared_ptr<Hook>> flatten_registered_hooks(
    const std::vector<std::shared_ptr<Hook>>& hooks);

/// Seed 002 `_fold_training_update_hooks`: replaces the update hooks and
/// orchestrators in `hooks` by one orchestrator placed where the first of
/// them was; other hooks keep their order. A single orchestrator alone is
/// kept as is; otherwise a new orchestrator is composed of all of them.
/// @throws ConfigError if `hooks` contains more than one orchestrator or a
///         null hook, or as TrainingUpdateOrchestrator's constructor.
std::vector<std::shared_ptr<Hook>> fold_training_update_hooks(
    const std::vector<std::shared_ptr<Hook>>& hooks);

/// Seed 002 `_order_update_orchestrator_before_dependent_hooks`: moves the
/// orchestrator (if any) in front of the first earlier hook whose
/// `requires_update_orchestrator_before(AFTER_OPTIMIZER_STEP)` is true.
std::vector<std::shared_ptr<Hook>> order_update_orchestrator_before_dependent_hooks(
    const std::vector<std::shared_ptr<Hook>>& hooks);

}  // namespace crucible
