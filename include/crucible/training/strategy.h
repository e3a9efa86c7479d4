#pragma once
// TrainingStrategy: the hook-driven supervised training loop (seed 002).

#include "crucible/data/dataset.h"
#include "crucible/losses/loss.h"
#include "crucible/models/energy_model.h"
#include "crucible/distributed/communicator.h"
#include "crucible/training/hook.h"
#include "crucible/training/lr_scheduler.h"
#include "crucible/training/optimizers.h"
#include "crucible/precision/precision.h"
#include "crucible/training/metrics.h"
#include "crucible/training/mixed_precision_hook.h"
#include "crucible/training/stages.h"
#include "crucible/training/update_hook.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// Whether validation runs under the mixed-precision hook's inference
/// autocast (seed 002 ValidationConfig.use_mixed_precision).
enum class ValidationPrecision {
  kAuto,    ///< if a MixedPrecisionHook is registered (the training mode's autocast).
  kAlways,  ///< as kAuto, but a run without a mixed mode is a ConfigError.
  kNever,   ///< never: the model's own dtype.
};

/// "auto", "always", "never" → ValidationPrecision. @throws ConfigError otherwise.
ValidationPrecision parse_validation_precision(const std::string& text);

/// When validation runs and on what data.
struct ValidationConfig {
  std::shared_ptr<const AtomicDataset> data;  ///< validation structures (required).
  int64_t every_n_epochs = 1;   ///< validate after every n-th epoch; 0 = never. Default 1.
  /// Validate every n optimizer steps that ran; 0 = never. Default 0. When
  /// > 0 it takes precedence (seed 002): every_n_epochs is then not used.
  int64_t every_n_steps = 0;
  int64_t batch_size = 16;      ///< Default 16.
  /// Evaluate the inference model (EMA weights, published by an EmaHook
  /// through set_inference_model) instead of the live model when one has
  /// been published (seed 002 ValidationConfig.use_ema). Default true.
  bool use_ema = true;
  /// Autocast during validation. Default kAuto.
  ValidationPrecision use_mixed_precision = ValidationPrecision::kAuto;
  /// Also evaluate the training loss on the validation data (seed 002
  /// validates with the strategy's loss_fn): ValidationSummary::loss and
  /// loss_components, at the weights of the current counters. Default true.
  bool compute_loss = true;
};

/// Everything a run needs besides the model, loss and data.
struct StrategyOptions {
  std::optional<int64_t> num_epochs;  ///< exactly one of num_epochs / num_steps.
  std::optional<int64_t> num_steps;
  double epoch_step_modifier = 1.0;   ///< epochs → steps multiplier (> 0). Default 1.
  /// The optimizer (with its scheduler) of the model "main" when
  /// `optimizer_configs` is empty; messages name it "training.optimizer"
  /// and its scheduler "training.scheduler".
  OptimizerConfig optimizer;
  /// Optimizers by model name (seed 002 `optimizer_configs`), each list
  /// non-empty; models without an entry are frozen (eval mode,
  /// requires_grad false) during run() / train_batch() and restored after.
  /// Messages name an entry "optimizer_configs.<model>[<i>]". Empty = use
  /// `optimizer` for "main".
  ///
  /// Schedulers (OptimizerConfig::scheduler) are built with their optimizer
  /// (a cosine t_max of 0 becomes the run's step target minus the warmup).
  /// Per-step schedulers step after every step of their optimizer that ran;
  /// a metric-driven one (plateau) after each scheduled validation, with
  /// the metric it monitors.
  std::map<std::string, std::vector<OptimizerConfig>> optimizer_configs;
  at::Device device = at::Device(at::kCPU);  ///< where model and batches live.
  at::ScalarType dtype = at::kFloat;         ///< model / batch float dtype. Default float32.
  std::optional<ValidationConfig> validation;
  /// Precision mode or alias (parse_precision: "64-true", "32-true",
  /// "bf16-mixed", "16-mixed", "bf16-true", "16-true", "fp16", ...).
  /// Default "": use `dtype` for model and batches, no precision plugin.
  /// When set it overrides `dtype`: the model is converted with the plugin's
  /// convert_module (parameters in param_dtype()) and batches with
  /// convert_input (geometry float64 under 64-true, float32 otherwise); for
  /// the mixed modes a MixedPrecisionHook of this mode is registered at the
  /// first run()/train_batch() unless one is registered already (a
  /// registered one of another mode is a ConfigError then). Issue 3.
  std::string precision;
  /// A precision plugin object of the caller's own (seed 004; e.g. a
  /// PrecisionPlugin subclass overriding convert_module or convert_input),
  /// used exactly as the plugin `precision` names; set at most one of the
  /// two. A plugin with an autocast_dtype() gets a MixedPrecisionHook that
  /// drives this same object. Null = none.
  std::shared_ptr<PrecisionPlugin> precision_plugin;
  /// Data-parallel training (issue 6). With more than one worker the
  /// strategy: sets world_size / global_rank from it; registers a
  /// DataParallelHook (bucket_cap_mb) at the first run()/train_batch()
  /// unless one is registered; shards validation and all-reduces its sums;
  /// agrees on stop requests after every batch (any worker's request stops
  /// all at the same batch). The data loader must be sharded by the caller
  /// (DataLoaderOptions::num_replicas / rank). Null = one process.
  std::shared_ptr<Communicator> communicator;
  double bucket_cap_mb = 25.0;  ///< DataParallelHook bucket size, MiB, > 0.
  /// Stop at the first non-finite loss or gradient (issue 8): registers a
  /// NonFiniteLossGuard at the first run()/train_batch() unless a
  /// SpikeSkippingHook (which skips such steps instead) or a guard is
  /// registered, or a plain (non-update) hook owns DO_BACKWARD or
  /// DO_OPTIMIZER_STEP. The stop's reason is then stop_reason(). Default true.
  bool stop_on_non_finite = true;
  /// Stop (with a reason, see stop_reason()) once this many batches in a
  /// row end without an optimizer step: a run whose every step is vetoed
  /// (spike skipping on a diverged model, a scaler that overflows forever)
  /// would otherwise never reach its step target. Gradient accumulation's
  /// own non-stepping micro-batches count too, so keep it well above
  /// gradient_accumulation_steps. 0 = never. Default 1000.
  int64_t max_batches_without_step = 1000;
};

/// Forward pass used for training: model and batch in, predictions out.
/// The default computes energy plus forces/stress as the loss needs them,
/// with `training = true` (create_graph).
using TrainingFn = std::function<ModelOutputs(EnergyModel& model, const Batch& batch)>;

/// Forward pass of a named-model strategy (seed 002): every model by name
/// (frozen ones included; run their forward under at::NoGradGuard or detach
/// unless gradients through them are wanted), batch in, predictions out.
using NamedTrainingFn =
    std::function<ModelOutputs(const std::map<std::string, EnergyModel*>& models, const Batch& batch)>;

/// Seed 002 default_training_fn: energy, forces when `forces`, and stress
/// when `stress` and some structure of the batch has a stress label, with
/// ComputeOptions::training (create_graph, so the loss can train on forces).
/// Shapes and units as compute_outputs. @throws what the model throws.
ModelOutputs default_training_fn(EnergyModel& model, const Batch& batch, bool forces = true,
                                 bool stress = true);

/// The supervised training loop.
///
/// Counters (seed 002): `step_count` advances when the optimizer step ran,
/// `batch_count` and `epoch_step_count` for every batch, `epoch_count` at
/// each epoch end; `global_step_count` = step_count × world size.
/// Duration: num_steps, or num_epochs converted to
/// ceil(num_epochs × len(loader) × epoch_step_modifier) steps.
/// Validation runs every `every_n_epochs` epochs / `every_n_steps` steps and
/// once more after training; AFTER_VALIDATION hooks then see the summary.
class TrainingStrategy {
 public:
  /// @throws ConfigError if not exactly one of num_epochs/num_steps is set,
  ///         a count is < 1, the loss is empty, an optimizer option is
  ///         invalid, or the hooks are invalid (see register_hook; the list
  ///         is folded and validated as a whole, like seed 002's constructor).
  TrainingStrategy(std::shared_ptr<EnergyModel> model, StrategyOptions options,
                   WeightedSumLoss loss, std::vector<std::shared_ptr<Hook>> hooks = {},
                   TrainingFn training_fn = {});
  /// Named models (seed 002: distillation, auxiliary models). The primary
  /// model (model(); validated, EMA-averaged, `ctx.model`) is "main" if
  /// present, else the first model (by name) with an optimizer config.
  /// Every model moves to options.device (one shared device).
  /// `training_fn` empty: the default forward on the primary model.
  /// @throws ConfigError as the single-model constructor, and for no models,
  ///   a null model, an optimizer_configs key that names no model (listing
  ///   the models), an empty config list, or no optimizer config at all.
  TrainingStrategy(std::map<std::string, std::shared_ptr<EnergyModel>> models,
                   StrategyOptions options, WeightedSumLoss loss,
                   std::vector<std::shared_ptr<Hook>> hooks = {},
                   NamedTrainingFn training_fn = {});
  ~TrainingStrategy();

  /// Registers a hook: a plain Hook, a bare TrainingUpdateHook, or a
  /// TrainingUpdateOrchestrator (seed 002 `register_hook`, seed 001).
  ///
  /// Update hooks and orchestrators are folded into ONE orchestrator
  /// (fold_training_update_hooks): it sits where the first update hook was
  /// registered; adding a bare update hook to a registered orchestrator
  /// replaces it by a new orchestrator holding both (the old object is left
  /// unchanged; see update_orchestrator()). The orchestrator is then moved in
  /// front of any earlier hook with
  /// `requires_update_orchestrator_before(AFTER_OPTIMIZER_STEP)`. Finally
  /// every hook of the registered set, orchestrator children included
  /// (flatten_registered_hooks), runs `validate_registered_hooks` on that set.
  /// On any error the registered hooks are left unchanged.
  /// @throws ConfigError for a null hook, a duplicate instance (children
  ///         included), a second claimant of DO_BACKWARD / DO_OPTIMIZER_STEP
  ///         (e.g. a DO-stage LambdaHook next to the orchestrator), a second
  ///         explicit orchestrator, a repeated exclusive update key, or a
  ///         failed dependency validation.
  void register_hook(std::shared_ptr<Hook> hook);
  /// Same as register_hook, for readability at call sites.
  void register_update_hook(std::shared_ptr<TrainingUpdateHook> hook) {
    register_hook(std::move(hook));
  }
  /// Seed 002 register_hook(hook, stage): registers a plain hook for
  /// `stage` only (it runs there, with its own frequency, whatever stages it
  /// declares; name, enter/exit, state and validation are its own).
  /// @throws ConfigError for an update hook or orchestrator (they declare
  ///   their own stages), and as register_hook.
  void register_hook(std::shared_ptr<Hook> hook, TrainingStage stage);

  /// Seed 002 close(): ends the strategy's use of its resources: calls
  /// close() on every registered hook once (in registration order; the
  /// update orchestrator closes its children in reverse order, seed 001) and
  /// tears the precision plugin down. Idempotent; counters, weights and
  /// optimizer state stay (state_files() still works). Throws what a hook's
  /// close() throws, after closing the others.
  void close();

  /// The declarative options as JSON (seed 002 to_spec_dict; see
  /// strategy_options_to_spec for the layout). @throws ConfigError for an
  /// optimizer config with a callable scheduler_metric (a spec cannot hold it).
  std::string to_spec() const;
  /// Seed 002 from_spec_dict: a strategy from to_spec() text plus the
  /// runtime pieces (`runtime` supplies device, communicator, validation
  /// data, a precision plugin object).
  /// @throws ConfigError naming the key path for a bad spec, and as the
  ///   constructor.
  static std::unique_ptr<TrainingStrategy> from_spec(
      const std::string& spec, std::map<std::string, std::shared_ptr<EnergyModel>> models,
      WeightedSumLoss loss, std::vector<std::shared_ptr<Hook>> hooks = {},
      NamedTrainingFn training_fn = {}, const StrategyOptions& runtime = {});

  /// Seed 002 save_checkpoint: writes state_files() (plus models.json and
  /// strategy.json = to_spec()) as a new checkpoint in the CheckpointStore at
  /// `dir` (created if missing; atomic, see checkpoint/checkpoint_store.h).
  /// Returns its index. @throws as crucible::save_checkpoint (earlier
  /// checkpoints stay intact).
  int64_t save_checkpoint(const std::string& dir);
  /// Seed 002 restore_checkpoint: restores checkpoint `index` of the store
  /// at `dir` (the newest intact one when unset) into this strategy.
  /// Returns the index used. @throws DataError as crucible::restore_checkpoint.
  int64_t restore_checkpoint(const std::string& dir, std::optional<int64_t> index = std::nullopt);
  /// Seed 002 load_checkpoint: a strategy rebuilt from a checkpoint's
  /// strategy.json (from_spec with the runtime pieces) with its state
  /// restored (restore_checkpoint). The models must have the checkpointed
  /// names and shapes (their weights come from the checkpoint).
  /// @throws DataError if the checkpoint has no strategy.json or does not
  ///   fit; ConfigError as from_spec.
  static std::unique_ptr<TrainingStrategy> load_checkpoint(
      const std::string& dir, std::map<std::string, std::shared_ptr<EnergyModel>> models,
      WeightedSumLoss loss, std::vector<std::shared_ptr<Hook>> hooks = {},
      NamedTrainingFn training_fn = {}, const StrategyOptions& runtime = {},
      std::optional<int64_t> index = std::nullopt);

  /// Trains over `loader` until the step target. Lifecycle (seed 002):
  /// enter hooks; SETUP (hooks may replace the loader through
  /// TrainContext::active_dataloader); counters prepared for a restart;
  /// optimizers and schedulers built for this run's step target (rebuilt if
  /// an earlier train_batch() or run() built them for another one; after a
  /// restore the rebuilt ones continue from the live optimizers' state, the
  /// restored one plus every step since); BEFORE_TRAINING, then per epoch
  /// BEFORE_EPOCH, the batches (see train_batch), AFTER_EPOCH;
  /// AFTER_TRAINING; exit hooks. AFTER_EPOCH, AFTER_VALIDATION and
  /// AFTER_TRAINING see the run's last batch and its detached loss (none
  /// before the first batch).
  ///
  /// Restartable: counters set before the call (e.g. from a checkpoint)
  /// continue the run mid-epoch. When epoch_step_count is 0 the position in
  /// the epoch is derived from batch_count (or step_count when that is 0):
  /// epoch_count += elapsed / len(loader), epoch_step_count = the rest;
  /// global_step_count = step_count × world size when it is 0.
  /// Denormals flush to zero while it runs (DenormalFlushGuard), as in
  /// train_batch().
  /// @throws std::invalid_argument if the loader yields no batch, a counter
  ///   is negative, or the counters are inconsistent (message gives the
  ///   expected value).
  void run(DataLoader& loader);
  /// The loader run() trains on (after SETUP), or null outside run().
  DataLoader* active_dataloader() const { return active_dataloader_; }

  /// Where run() calls boundary callbacks: after a batch (its step-cadence
  /// validation and metric-scheduler step done; not when the batch ended an
  /// epoch), after an epoch (AFTER_EPOCH, its validation and scheduler step
  /// done), after training (AFTER_TRAINING and the final validation done),
  /// or when run() stops through request_stop().
  enum class Boundary { kBatch, kEpoch, kEnd, kStop };
  using BoundaryCallback = std::function<void(TrainingStrategy&, Boundary)>;
  /// Registers `fn`: called at every boundary of run(), in registration
  /// order. At a boundary all state is consistent: a checkpoint taken there
  /// (state_files) resumes exactly. Used by CheckpointHook.
  void add_boundary_callback(BoundaryCallback fn) { boundary_callbacks_.push_back(std::move(fn)); }

  /// Asks run() to stop after the current batch (e.g. from a hook, or a
  /// SIGINT/SIGTERM handler's flag): it then returns without AFTER_TRAINING
  /// and without the final validation, with the counters at the last batch
  /// (a checkpoint taken then resumes exactly). Cleared when run() starts.
  /// Data parallel: every worker stops at the same batch, the first one
  /// after the request reached all of them (the flag rides in the next
  /// gradient all-reduce, or a one-element all-reduce on batches without
  /// one), i.e. usually one batch later than in one process.
  void request_stop() { stop_requested_ = true; }
  /// As request_stop(), recording why (the first reason of a run is kept):
  /// a stop with a reason is a failure the caller reports, e.g.
  /// NonFiniteLossGuard's "non-finite loss (nan) at step 12, ...".
  void request_stop(const std::string& reason) {
    if (stop_reason_.empty()) stop_reason_ = reason;
    stop_requested_ = true;
  }
  /// The reason given to request_stop(reason) in this run; empty after a
  /// plain request_stop() (a signal) or none.
  const std::string& stop_reason() const { return stop_reason_; }
  /// True once request_stop() was called in this run (this worker only).
  bool stop_requested() const { return stop_requested_; }
  /// Records the workers' agreed stop decision of the current batch
  /// (DataParallelHook, from the all-reduced flags). Never throws.
  void agree_stop(bool any_worker_requested) { reduced_stop_ = any_worker_requested; }
  /// True if the last run() ended through request_stop().
  bool stopped_early() const { return stopped_early_; }
  /// Early stopping (MACE's --patience, BestModelHook): ends run() normally
  /// before its target, after the current batch or epoch boundary (its
  /// validation done). Unlike request_stop(), the end stage runs as when the
  /// target is reached (AFTER_TRAINING, the final validation, the end
  /// checkpoint). The step is saved with the counters
  /// ("finished_early_at_step"), so a resumed run does not train further.
  /// The first reason of a run is kept. Data parallel: every worker must
  /// request it at the same point (a hook deciding on the all-reduced
  /// validation metrics does). Never throws.
  void request_finish(const std::string& reason) {
    if (finish_reason_.empty()) finish_reason_ = reason;
    if (finished_early_at_step_ < 0) finished_early_at_step_ = step_count;
  }
  /// Why the run finished before its target ("" if it did not).
  const std::string& finish_reason() const { return finish_reason_; }
  /// The step at which request_finish() ended the run (restored from a
  /// checkpoint too); -1 if it did not.
  int64_t finished_early_at_step() const { return finished_early_at_step_; }

  /// Calls the hooks registered for `stage` once, with a context of the
  /// current counters and no batch, exactly as run() dispatches a stage
  /// (for tools and the hook-dispatch benchmark). Throws what a hook throws.
  void dispatch_stage(TrainingStage stage);

  /// Trains on one batch: enters the hooks, runs SETUP (on every call, as
  /// seed 002), builds the optimizers on first use (for num_steps, or 0
  /// steps under num_epochs), then BEFORE_BATCH; zero_grad (by the update
  /// orchestrator unless one of its hooks vetoes BEFORE_BATCH, else by the
  /// strategy); gradients of trainable parameters no optimizer owns reset;
  /// BEFORE_FORWARD, forward, AFTER_FORWARD, BEFORE_LOSS, loss, AFTER_LOSS,
  /// BEFORE_BACKWARD, DO_BACKWARD (or backward()), AFTER_BACKWARD,
  /// BEFORE_OPTIMIZER_STEP, DO_OPTIMIZER_STEP (or step every optimizer and
  /// its scheduler), AFTER_OPTIMIZER_STEP, counters, AFTER_BATCH; exits the
  /// hooks. Advances counters like `run`. Denormals flush to zero during the
  /// call, on this thread and the intra-op threads (common/denormals.h).
  void train_batch(const Batch& batch);

  /// Runs validation now, fires AFTER_VALIDATION, returns the summary.
  /// Evaluates inference_model() instead of the live model when one is
  /// published and the validation config's use_ema is true (the summary's
  /// `inference_model` says which). Does not step metric-driven schedulers
  /// (run() does that after each scheduled validation).
  /// With a MixedPrecisionHook registered, the model is evaluated inside its
  /// inference_context() (seed 000: bf16 autocast for bf16-mixed); batches
  /// use batch_dtype().
  /// @throws std::logic_error if no validation is configured.
  ValidationSummary validate();

  /// The run's state as named files (issue 5; seed 002 save_checkpoint), each
  /// a torch::serialize archive of named tensors:
  ///  - "counters.pt": step_count, global_step_count, batch_count,
  ///    epoch_count, epoch_step_count, world_size (int64);
  ///  - "model.<name>.pt": parameters and buffers of every model;
  ///  - "grads.<name>.pt": the gradients held now of the parameters an
  ///    optimizer owns (a gradient-accumulation cycle stopped in the middle
  ///    continues exactly); others are cleared before every batch anyway;
  ///  - "optimizer.<i>.pt": Optimizer::save, and "optimizer.<i>.lr.pt" the lr
  ///    of every param group (torch::load does not restore it);
  ///  - "scheduler.<i>.pt": LrScheduler::state_dict as float64 scalars;
  ///  - "hooks.pt": the hook_state() of every registered hook that has one,
  ///    in registration order ("hook.<k>" its name, "state.<k>.<key>");
  ///  - "rng.pt": the CPU generator state ("cpu") and, in CUDA builds, each
  ///    visible GPU's default generator ("cuda:<i>"; restored for the GPUs present).
  /// The data loader position is (epoch_count, epoch_step_count); the loss
  /// weight schedules are functions of the counters.
  std::vector<std::pair<std::string, std::string>> state_files();
  /// Restores state_files() into this strategy (same models, optimizer
  /// configs and hooks): counters, weights, hook states and RNG now;
  /// optimizer, scheduler and gradient state when the optimizers are built
  /// (the next run()/train_batch(); at once if they exist).
  /// Each saved hook state goes to the next registered hook of the same name.
  /// Seed 002 restore checks: a counter < 0 is refused; global_step_count
  /// 0 becomes step_count × world size; the files must hold exactly one
  /// "optimizer.<i>.pt" per configured optimizer and a "scheduler.<i>.pt"
  /// exactly where the configuration has a scheduler.
  /// @throws DataError naming the file for a missing or unreadable file, a
  ///   missing parameter, a shape mismatch, a negative counter, more or fewer
  ///   optimizer / scheduler states than configured (naming both), or a saved
  ///   hook state that no registered hook (in order) takes.
  void restore_state_files(const std::map<std::string, std::string>& files);

  /// Target optimizer-step count for a loader with `batches_per_epoch` batches.
  /// @throws std::invalid_argument if num_epochs is set and batches_per_epoch <= 0.
  int64_t target_step_count(int64_t batches_per_epoch) const;
  /// True if validation is due after the epoch that just completed.
  bool validation_due_after_epoch() const;

  /// The primary model (see the named-model constructor).
  EnergyModel& model() { return *model_; }
  std::shared_ptr<EnergyModel> model_ptr() const { return model_; }
  /// Every model by name (a single model is "main").
  const std::map<std::string, std::shared_ptr<EnergyModel>>& models() const { return models_; }

  /// Parameter filters (seed 002), by qualified name "<model>.<parameter>"
  /// (e.g. "main.embedding.weight"); std::nullopt clears a filter. Applied
  /// for the duration of run() / train_batch() and undone after it, also
  /// when it throws:
  ///  - optimizer filter: only these parameters are given to optimizers
  ///    (read when the optimizers are built, at the first run/train_batch);
  ///  - trainable filter: parameters outside it get requires_grad false;
  ///  - force-trainable filter: these get requires_grad true (wins over the
  ///    trainable filter and over the freezing of unconfigured models).
  void set_optimizer_parameter_filter(std::optional<std::set<std::string>> names) {
    optimizer_filter_ = std::move(names);
  }
  void set_trainable_parameter_filter(std::optional<std::set<std::string>> names) {
    trainable_filter_ = std::move(names);
  }
  void set_force_trainable_parameter_filter(std::optional<std::set<std::string>> names) {
    force_trainable_filter_ = std::move(names);
  }
  const StrategyOptions& options() const { return options_; }
  /// Top-level hooks in dispatch order (update hooks appear as their orchestrator).
  const std::vector<std::shared_ptr<Hook>>& hooks() const { return hooks_; }
  /// Every registered hook, orchestrator children right after it.
  std::vector<std::shared_ptr<Hook>> registered_hooks() const {
    return flatten_registered_hooks(hooks_);
  }
  /// The update orchestrator, or null when no update hook is registered.
  std::shared_ptr<TrainingUpdateOrchestrator> update_orchestrator() const;
  std::vector<torch::optim::Optimizer*> optimizers();
  /// Scheduler of each optimizer (paired by index, null = none); empty
  /// before the optimizer is built.
  std::vector<LrScheduler*> lr_schedulers();

  /// Publishes the model validation evaluates when use_ema is set (seed 002
  /// `set_inference_model`; EmaHook publishes its averaged copy), moved to
  /// options().device first; it must have the live model's dtype. Null
  /// clears it.
  void set_inference_model(std::shared_ptr<EnergyModel> model) {
    set_inference_model(std::move(model), model_name_of_primary());
  }
  /// Seed 002 set_inference_model(module, model_key): publishes the
  /// inference copy of the model named `model_key` (a named-model strategy
  /// may hold one per model; validation evaluates the primary model's),
  /// moved to options().device first. A single-model strategy ignores the
  /// key (seed 002: its slot holds one module). Null clears it.
  /// @throws ConfigError if several models are held and none has that name
  ///   (listing them).
  void set_inference_model(std::shared_ptr<EnergyModel> model, const std::string& model_key);
  /// The published inference model of the primary model, or null.
  std::shared_ptr<EnergyModel> inference_model() const {
    return inference_model(model_name_of_primary());
  }
  /// The published inference model of `model_key`, or null.
  std::shared_ptr<EnergyModel> inference_model(const std::string& model_key) const {
    auto it = inference_models_.find(model_key);
    return it == inference_models_.end() ? nullptr : it->second;
  }
  /// Name of the primary model (model()).
  std::string model_name_of_primary() const;
  /// The registered MixedPrecisionHook (orchestrator children searched), or null.
  std::shared_ptr<MixedPrecisionHook> precision_hook() const { return precision_hook_; }
  /// The run's precision plugin: the registered MixedPrecisionHook's, else the
  /// strategy's own (when options.precision is set), else null. This is what
  /// TrainContext::precision points to.
  PrecisionPlugin* precision_plugin() const;
  /// Float dtype batches are converted to (plugin input_dtype() or options.dtype).
  at::ScalarType batch_dtype() const;
  const std::optional<ValidationSummary>& last_validation() const { return last_validation_; }

  int64_t step_count = 0;
  int64_t global_step_count = 0;
  int64_t batch_count = 0;
  int64_t epoch_count = 0;
  int64_t epoch_step_count = 0;
  int world_size = 1;   ///< workers of a data-parallel run (options.communicator).
  int global_rank = 0;  ///< this worker's rank.

 private:
  void ensure_data_parallel_hook();
  // Registers a NonFiniteLossGuard unless one or a SpikeSkippingHook is
  // registered, or StrategyOptions::stop_on_non_finite is false.
  void ensure_non_finite_loss_guard();
  void agree_on_stop_request();
  // AFTER_TRAINING hooks, the final validation (when configured), then the
  // end boundary (the end checkpoint); marks end_stage_done_ before it.
  void run_end_stage();
  void run_hooks(TrainingStage stage, TrainContext& ctx);
  void install_hooks(std::vector<std::shared_ptr<Hook>> hooks);
  class RunScope;
  void check_configs();
  // Builds the optimizers and schedulers for `total_steps` unless built;
  // `for_run`: rebuild those built for another horizon (by train_batch).
  void ensure_optimizer(int64_t total_steps, bool for_run);
  // Seed 002 _prepare_epoch_step_count (and the counter checks of
  // from_checkpoint_dict). @throws std::invalid_argument.
  void prepare_restart_counters(int64_t batches_per_epoch);
  void zero_optimizer_filtered_gradients();
  // Every model name, comma-separated (for messages).
  std::string model_names() const;
  // Seed 004 convert_input (geometry kept >= float32), or a cast to options.dtype.
  Batch convert_batch(const Batch& batch) const;
  // Backward and optimizer steps when no hook owns them (through the plugin).
  void plain_backward(const at::Tensor& loss, const std::vector<at::Tensor>& parameters);
  void plain_optimizer_step();
  // TensorImpl addresses of every parameter an optimizer holds.
  std::set<const void*> optimizer_owned_parameters() const;
  // @throws DataError when `files` hold more or fewer optimizer / scheduler
  // states than entries_ configure.
  void check_optimizer_files(const std::map<std::string, std::string>& files) const;
  void apply_pending_optimizer_state();
  void set_configured_models_training();
  void validate_and_step_metric_schedulers();
  void train_batch_impl(const Batch& batch);
  void maybe_validate_after_step();
  void enter_hooks();
  void exit_hooks(bool failed);
  TrainContext make_context(const Batch* batch);
  /// make_context with the last trained batch and its detached losses
  /// (none before the first batch of a run).
  TrainContext make_after_batch_context();
  void ensure_precision_hook();

  /// One optimizer config with its model and message paths.
  struct OptimizerEntry {
    std::string model;
    OptimizerConfig config;
    std::string path;            ///< "training.optimizer" or "optimizer_configs.<m>[<i>]".
    std::string scheduler_path;  ///< "training.scheduler" or "<path>.scheduler".
  };

  std::map<std::string, std::shared_ptr<EnergyModel>> models_;
  std::shared_ptr<EnergyModel> model_;  ///< primary
  StrategyOptions options_;
  WeightedSumLoss loss_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  NamedTrainingFn training_fn_;
  std::vector<OptimizerEntry> entries_;
  std::optional<std::set<std::string>> optimizer_filter_, trainable_filter_, force_trainable_filter_;
  std::shared_ptr<PrecisionPlugin> precision_;  ///< options.precision(_plugin), or null.
  std::shared_ptr<MixedPrecisionHook> precision_hook_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;
  std::vector<std::unique_ptr<LrScheduler>> schedulers_;  ///< paired with optimizers_, null = none
  std::map<std::string, std::shared_ptr<EnergyModel>> inference_models_;  ///< by model name
  std::map<std::string, std::string> pending_state_;  ///< optimizer files awaiting the optimizers
  /// World size of a restored checkpoint when it differs from this run's.
  std::optional<int64_t> saved_world_size_;
  std::optional<ValidationSummary> last_validation_;
  /// The last trained batch of this run and its detached losses: the
  /// context of AFTER_EPOCH, AFTER_VALIDATION and AFTER_TRAINING (seed 002).
  std::optional<Batch> last_batch_;
  std::optional<LossOutput> last_losses_;
  bool has_do_backward_ = false;
  bool has_update_orchestrator_ = false;
  int64_t optimizer_horizon_ = 0;  ///< total_steps the optimizers were built for
  /// The gradient ("grads.<model>.pt"), optimizer, lr and scheduler files
  /// of state_files(): what apply_pending_optimizer_state takes.
  std::vector<std::pair<std::string, std::string>> optimizer_state_files();
  /// A checkpoint was restored: a later optimizer rebuild carries the live
  /// optimizers' state over (optimizer_state_files).
  bool restored_ = false;
  DataLoader* active_dataloader_ = nullptr;
  std::set<const Hook*> closed_;  ///< hooks close() has closed
  bool has_do_optimizer_step_ = false;
  bool optimizer_step_skipped_ = false;
  int64_t batches_without_step_ = 0;  // consecutive batches whose step did not run
  bool stop_requested_ = false;
  std::string stop_reason_;
  bool stop_agreed_ = false;           ///< the decision every worker acts on
  std::optional<bool> reduced_stop_;   ///< agreed in this batch's gradient all-reduce
  bool stopped_early_ = false;
  /// The end stage (AFTER_TRAINING, final validation, end checkpoint) ran
  /// after the last step; saved in counters.pt as training_finished.
  bool end_stage_done_ = false;
  int64_t finished_early_at_step_ = -1;  ///< request_finish(); counters.pt
  std::string finish_reason_;
  std::vector<BoundaryCallback> boundary_callbacks_;
  void at_boundary(Boundary b) {
    for (auto& fn : boundary_callbacks_) fn(*this, b);
  }
};

}  // namespace crucible
