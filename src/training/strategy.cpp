#include "crucible/training/strategy.h"

#include "crucible/common/denormals.h"
#include "crucible/common/error.h"
#include "crucible/training/allocator.h"
#include "crucible/training/data_parallel.h"
#include "crucible/training/non_finite_loss.h"
#include "crucible/training/spike_skipping.h"

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <exception>
#include <cmath>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace crucible {

namespace {

LossOutput detach_losses(const LossOutput& in) {
  LossOutput out;
  out.total = in.total.detach();
  for (const auto& [k, v] : in.components) out.components[k] = v.detach();
  out.weights = in.weights;
  return out;
}

ModelOutputs detach_outputs(const ModelOutputs& in) {
  ModelOutputs out;
  if (in.energy.defined()) out.energy = in.energy.detach();
  if (in.forces.defined()) out.forces = in.forces.detach();
  if (in.stress.defined()) out.stress = in.stress.detach();
  return out;
}

/// Runs a plain hook at one stage only (register_hook(hook, stage)).
class StageBoundHook : public Hook {
 public:
  StageBoundHook(std::shared_ptr<Hook> hook, TrainingStage stage)
      : hook_(std::move(hook)), stage_(stage) {}
  std::string name() const override { return hook_->name(); }
  bool runs_on_stage(TrainingStage stage) const override { return stage == stage_; }
  int64_t frequency() const override { return hook_->frequency(); }
  void operator()(TrainContext& ctx, TrainingStage stage) override { (*hook_)(ctx, stage); }
  void enter() override { hook_->enter(); }
  void exit(bool failed) override { hook_->exit(failed); }
  void close() override { hook_->close(); }
  bool requires_update_orchestrator_before(TrainingStage stage) const override {
    return hook_->requires_update_orchestrator_before(stage);
  }
  void validate_registered_hooks(const std::vector<std::shared_ptr<Hook>>& hooks) const override {
    hook_->validate_registered_hooks(hooks);
  }
  std::map<std::string, at::Tensor> hook_state() const override { return hook_->hook_state(); }
  void load_hook_state(const std::map<std::string, at::Tensor>& state) override {
    hook_->load_hook_state(state);
  }

 private:
  std::shared_ptr<Hook> hook_;
  TrainingStage stage_;
};

}  // namespace

ModelOutputs default_training_fn(EnergyModel& model, const Batch& batch, bool forces, bool stress) {
  ComputeOptions co;
  co.forces = forces;
  co.stress = stress && batch.has_stress.defined() && batch.has_stress.any().item<bool>();
  co.training = true;
  return compute_outputs(model, batch, co);
}

ValidationPrecision parse_validation_precision(const std::string& text) {
  if (text == "auto") return ValidationPrecision::kAuto;
  if (text == "always") return ValidationPrecision::kAlways;
  if (text == "never") return ValidationPrecision::kNever;
  throw ConfigError("validation.use_mixed_precision must be one of auto, always, never, got '" +
                    text + "'");
}

TrainingStrategy::TrainingStrategy(std::shared_ptr<EnergyModel> model, StrategyOptions options,
                                   WeightedSumLoss loss, std::vector<std::shared_ptr<Hook>> hooks,
                                   TrainingFn training_fn)
    : TrainingStrategy(
          std::map<std::string, std::shared_ptr<EnergyModel>>{{"main", model}}, std::move(options),
          std::move(loss), std::move(hooks),
          training_fn ? NamedTrainingFn([fn = std::move(training_fn), model](
                                            const std::map<std::string, EnergyModel*>&,
                                            const Batch& b) { return fn(*model, b); })
                      : NamedTrainingFn{}) {}

TrainingStrategy::TrainingStrategy(std::map<std::string, std::shared_ptr<EnergyModel>> models,
                                   StrategyOptions options, WeightedSumLoss loss,
                                   std::vector<std::shared_ptr<Hook>> hooks,
                                   NamedTrainingFn training_fn)
    : models_(std::move(models)),
      options_(std::move(options)),
      loss_(std::move(loss)),
      training_fn_(std::move(training_fn)) {
  if (models_.empty()) throw ConfigError("models must contain at least one model, got none");
  for (const auto& [name, m] : models_) {
    if (!m) throw ConfigError("model '" + name + "' must be set, got null");
  }
  const bool have_epochs = options_.num_epochs.has_value();
  const bool have_steps = options_.num_steps.has_value();
  if (have_epochs == have_steps) {
    throw ConfigError(std::string("exactly one of training.num_epochs or training.num_steps must "
                                  "be set, got ") +
                      (have_epochs ? "both" : "neither"));
  }
  if (have_epochs && *options_.num_epochs < 1) {
    throw ConfigError("training.num_epochs must be >= 1, got " +
                      std::to_string(*options_.num_epochs));
  }
  if (have_steps && *options_.num_steps < 1) {
    throw ConfigError("training.num_steps must be >= 1, got " +
                      std::to_string(*options_.num_steps));
  }
  if (!(options_.epoch_step_modifier > 0.0) || !std::isfinite(options_.epoch_step_modifier)) {
    throw ConfigError("training.epoch_step_modifier must be a finite number > 0, got " +
                      std::to_string(options_.epoch_step_modifier));
  }
  if (loss_.empty()) throw ConfigError("loss must have at least one term with a weight, got none");
  tune_allocator_for_training();
  if (options_.communicator) {
    world_size = options_.communicator->size();
    global_rank = options_.communicator->rank();
    if (!(options_.bucket_cap_mb > 0)) {
      throw ConfigError("training.distributed.bucket_cap_mb must be > 0, got " +
                        std::to_string(options_.bucket_cap_mb));
    }
  }
  if (options_.validation) {
    const auto& v = *options_.validation;
    if (!v.data || v.data->size() == 0) {
      throw ConfigError("validation data must contain at least one structure, got none");
    }
    if (v.every_n_epochs < 0 || v.every_n_steps < 0) {
      throw ConfigError("validation.every_n_epochs and every_n_steps must be >= 0");
    }
    if (v.use_mixed_precision == ValidationPrecision::kAlways) {
      bool mixed = false;
      if (!options_.precision.empty()) {
        mixed = make_precision_plugin(options_.precision)->autocast_dtype().has_value();
      }
      if (options_.precision_plugin) mixed = options_.precision_plugin->autocast_dtype().has_value();
      for (const auto& h : flatten_registered_hooks(hooks)) {
        mixed = mixed || std::dynamic_pointer_cast<MixedPrecisionHook>(h) != nullptr;
      }
      if (!mixed) {
        throw ConfigError("validation.use_mixed_precision = always needs a mixed precision mode "
                          "(training.precision bf16-mixed or 16-mixed), got '" +
                          (options_.precision.empty() ? std::string("none") : options_.precision) +
                          "'");
      }
    }
  }
  check_configs();
  if (!training_fn_) {
    const bool forces = loss_.needs_forces();
    const bool stress = loss_.needs_stress();
    EnergyModel* primary = model_.get();
    training_fn_ = [forces, stress, primary](const std::map<std::string, EnergyModel*>&,
                                             const Batch& b) {
      return default_training_fn(*primary, b, forces, stress);
    };
  }
  if (!options_.precision.empty() && options_.precision_plugin) {
    throw ConfigError("set at most one of StrategyOptions::precision ('" + options_.precision +
                      "') and StrategyOptions::precision_plugin, got both");
  }
  if (!options_.precision.empty()) {
    precision_ = make_precision_plugin(options_.precision);  // ConfigError on a bad mode
  }
  if (options_.precision_plugin) precision_ = options_.precision_plugin;
  for (auto& [name, m] : models_) {
    if (precision_) {
      m->module().to(options_.device);
      precision_->convert_module(m->module());
    } else {
      m->module().to(options_.device, options_.dtype);
    }
  }
  install_hooks(std::move(hooks));
}

void TrainingStrategy::check_configs() {
  entries_.clear();
  if (options_.optimizer_configs.empty()) {
    if (models_.count("main") == 0) {
      const std::string names = model_names();
      throw ConfigError("optimizer_configs must name the models to train when there is no model "
                        "'main', got none (models: " + names + ")");
    }
    entries_.push_back({"main", options_.optimizer, "training.optimizer", "training.scheduler"});
  } else {
    for (const auto& [name, configs] : options_.optimizer_configs) {
      if (models_.count(name) == 0) {
        const std::string names = model_names();
        throw ConfigError("optimizer_configs key '" + name + "' must name a model (" + names +
                          "), got no such model");
      }
      if (configs.empty()) {
        throw ConfigError("optimizer_configs." + name +
                          " must contain at least one optimizer config, got none");
      }
      for (size_t i = 0; i < configs.size(); ++i) {
        const std::string path = "optimizer_configs." + name + "[" + std::to_string(i) + "]";
        entries_.push_back({name, configs[i], path, path + ".scheduler"});
      }
    }
  }
  for (const auto& e : entries_) {
    check_optimizer_config(e.config, e.path);
    if (!e.config.scheduler) continue;
    check_scheduler_config(*e.config.scheduler, e.scheduler_path);
    if (e.config.scheduler->name != "plateau") continue;
    if (!options_.validation) {
      throw ConfigError(e.scheduler_path + ": the plateau scheduler steps on a validation "
                        "metric and needs a validation config, got none");
    }
    try {
      (void)validation_monitor_value(ValidationSummary{}, e.config.scheduler->plateau.monitor);
    } catch (const std::invalid_argument& err) {
      throw ConfigError(e.scheduler_path + ".monitor " + err.what());
    }
  }
  // Primary model: "main", else the first configured one.
  auto main = models_.find("main");
  model_ = main != models_.end() ? main->second : models_.at(entries_.front().model);
}

/// Applies the run-time parameter state (seed 002 `_apply_requires_grad_filter`,
/// `freeze_unconfigured_models`) and restores the saved one on destruction.
class TrainingStrategy::RunScope {
 public:
  explicit RunScope(TrainingStrategy& s) {
    std::set<std::string> configured;
    for (const auto& e : s.entries_) configured.insert(e.model);
    for (auto& [name, m] : s.models_) {
      torch::nn::Module& mod = m->module();
      modes_.emplace_back(&mod, mod.is_training());
      const bool frozen = configured.count(name) == 0;
      if (frozen) mod.eval();
      for (auto& item : mod.named_parameters(true)) {
        at::Tensor p = item.value();
        const std::string q = name + "." + item.key();
        flags_.emplace_back(p, p.requires_grad());
        bool want = p.requires_grad();
        if (frozen) want = false;
        if (s.trainable_filter_ && s.trainable_filter_->count(q) == 0) want = false;
        if (s.force_trainable_filter_ && s.force_trainable_filter_->count(q) > 0) want = true;
        if (want != p.requires_grad()) p.requires_grad_(want);
      }
    }
  }
  ~RunScope() {
    for (auto& [p, flag] : flags_) {
      if (p.requires_grad() != flag) p.requires_grad_(flag);
    }
    for (auto& [mod, training] : modes_) mod->train(training);
  }
  RunScope(const RunScope&) = delete;
  RunScope& operator=(const RunScope&) = delete;

 private:
  std::vector<std::pair<at::Tensor, bool>> flags_;
  std::vector<std::pair<torch::nn::Module*, bool>> modes_;
};

void TrainingStrategy::set_configured_models_training() {
  for (const auto& e : entries_) models_.at(e.model)->module().train(true);
}

TrainingStrategy::~TrainingStrategy() = default;

void TrainingStrategy::register_hook(std::shared_ptr<Hook> hook) {
  if (!hook) throw ConfigError("hooks must not contain null, got a null hook");
  auto candidate = hooks_;
  candidate.push_back(std::move(hook));
  install_hooks(std::move(candidate));
}

void TrainingStrategy::register_hook(std::shared_ptr<Hook> hook, TrainingStage stage) {
  if (!hook) throw ConfigError("hooks must not contain null, got a null hook");
  if (std::dynamic_pointer_cast<TrainingUpdateHook>(hook) ||
      std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(hook)) {
    throw ConfigError("register_hook(hook, stage): '" + hook->name() +
                      "' is an update hook or orchestrator, which declares its own stages; "
                      "register it without a stage");
  }
  register_hook(std::make_shared<StageBoundHook>(std::move(hook), stage));
}

void TrainingStrategy::close() {
  std::exception_ptr first;
  for (const auto& h : hooks_) {
    if (closed_.count(h.get()) > 0) continue;
    closed_.insert(h.get());
    // Seed 001: the orchestrator closes its children, in reverse order.
    if (auto orch = std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(h)) {
      for (const auto& child : orch->hooks()) closed_.insert(child.get());
    }
    try {
      h->close();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (PrecisionPlugin* plugin = precision_plugin()) plugin->teardown();
  if (first) std::rethrow_exception(first);
}

std::string TrainingStrategy::model_names() const {
  std::string names;
  for (const auto& [n, m] : models_) names += (names.empty() ? "" : ", ") + n;
  return names;
}

std::string TrainingStrategy::model_name_of_primary() const {
  for (const auto& [name, m] : models_) {
    if (m == model_) return name;
  }
  return "main";
}

void TrainingStrategy::set_inference_model(std::shared_ptr<EnergyModel> model,
                                           const std::string& model_key) {
  // Seed 002: the published module goes to the training device first, and
  // a single-model strategy ignores the key (its slot holds one module).
  if (model) model->module().to(options_.device);
  if (models_.size() == 1) {
    inference_models_.clear();
    if (model) inference_models_[models_.begin()->first] = std::move(model);
    return;
  }
  if (models_.count(model_key) == 0) {
    const std::string names = model_names();
    throw ConfigError("set_inference_model: model_key must name a model (" + names + "), got '" +
                      model_key + "'");
  }
  if (!model) {
    inference_models_.erase(model_key);
    return;
  }
  inference_models_[model_key] = std::move(model);
}

void TrainingStrategy::install_hooks(std::vector<std::shared_ptr<Hook>> hooks) {
  for (const auto& h : hooks) {
    if (!h) throw ConfigError("hooks must not contain null, got a null hook");
  }
  // Duplicates over the flattened set (orchestrator children included).
  const auto check_duplicates = [](const std::vector<std::shared_ptr<Hook>>& set) {
    for (size_t i = 0; i < set.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (set[i] == set[j]) {
          throw ConfigError("hooks must not contain duplicate hook instances, got '" +
                            set[i]->name() + "' twice; pass distinct hook objects instead");
        }
      }
    }
  };
  check_duplicates(flatten_registered_hooks(hooks));
  // Seed 002: fold update hooks into one orchestrator, order it before
  // hooks that observe its post-step state, then validate.
  auto candidate =
      order_update_orchestrator_before_dependent_hooks(fold_training_update_hooks(hooks));
  const auto registered = flatten_registered_hooks(candidate);
  for (TrainingStage do_stage : {TrainingStage::DO_BACKWARD, TrainingStage::DO_OPTIMIZER_STEP}) {
    std::vector<std::shared_ptr<Hook>> claimants;
    for (const auto& h : candidate) {
      if (h->runs_on_stage(do_stage)) claimants.push_back(h);
    }
    if (claimants.size() <= 1) continue;
    std::string names;
    bool has_orchestrator = false;
    for (const auto& h : claimants) {
      names += (names.empty() ? "" : ", ") + h->name();
      has_orchestrator = has_orchestrator ||
                         std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(h) != nullptr;
    }
    std::string msg = std::string("at most one hook may claim ") + stage_name(do_stage) +
                      ", got " + std::to_string(claimants.size()) + ": " + names;
    if (has_orchestrator) {
      msg += "; if a plain DO-stage hook should compose with update policies, implement it as a "
             "TrainingUpdateHook so it runs inside the TrainingUpdateOrchestrator";
    }
    throw ConfigError(msg);
  }
  for (const auto& h : registered) h->validate_registered_hooks(registered);
  hooks_ = std::move(candidate);
  precision_hook_.reset();
  for (const auto& h : registered) {
    if (auto mp = std::dynamic_pointer_cast<MixedPrecisionHook>(h)) precision_hook_ = mp;
  }
  // Seed 004: a plugin object given through a registered
  // MixedPrecisionHook(plugin) converts the models, batches and outputs
  // when the strategy has no plugin of its own.
  if (precision_hook_ && !precision_) {
    if (auto given = precision_hook_->given_plugin()) {
      precision_ = std::move(given);
      for (auto& [name, m] : models_) {
        m->module().to(options_.device);
        precision_->convert_module(m->module());
      }
    }
  }
  has_do_backward_ = has_do_optimizer_step_ = false;
  has_update_orchestrator_ = false;
  for (const auto& h : hooks_) {
    has_update_orchestrator_ = has_update_orchestrator_ ||
                               std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(h) != nullptr;
    has_do_backward_ = has_do_backward_ || h->runs_on_stage(TrainingStage::DO_BACKWARD);
    has_do_optimizer_step_ =
        has_do_optimizer_step_ || h->runs_on_stage(TrainingStage::DO_OPTIMIZER_STEP);
  }
}

std::shared_ptr<TrainingUpdateOrchestrator> TrainingStrategy::update_orchestrator() const {
  for (const auto& h : hooks_) {
    if (auto orch = std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(h)) return orch;
  }
  return nullptr;
}

std::vector<torch::optim::Optimizer*> TrainingStrategy::optimizers() {
  std::vector<torch::optim::Optimizer*> out;
  for (auto& o : optimizers_) out.push_back(o.get());
  return out;
}

std::vector<LrScheduler*> TrainingStrategy::lr_schedulers() {
  std::vector<LrScheduler*> out;
  for (auto& s : schedulers_) out.push_back(s.get());
  return out;
}

void TrainingStrategy::ensure_optimizer(int64_t total_steps, bool for_run) {
  if (!optimizers_.empty()) {
    // Seed 002: run() builds its optimizers for its own horizon; those that
    // train_batch() built for another one are rebuilt. After a restore the
    // new ones continue from the live optimizers' state (the restored one
    // plus every step since), never from the checkpoint's again: the weights
    // have moved on (issue 49).
    if (!for_run || optimizer_horizon_ == total_steps) return;
    if (pending_state_.empty() && restored_) {
      for (auto& [name, bytes] : optimizer_state_files()) pending_state_[name] = std::move(bytes);
    }
    optimizers_.clear();
    schedulers_.clear();
  }
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  std::vector<std::unique_ptr<LrScheduler>> schedulers;
  std::map<std::string, std::set<std::string>> taken;  // model → parameter names
  for (const auto& e : entries_) {
    std::optional<std::regex> select;
    if (!e.config.params.empty()) select = std::regex(e.config.params, std::regex::ECMAScript);
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (auto& item : models_.at(e.model)->module().named_parameters(true)) {
      const std::string& n = item.key();
      if (!item.value().requires_grad() || taken[e.model].count(n) > 0) continue;
      if (optimizer_filter_ && optimizer_filter_->count(e.model + "." + n) == 0) continue;
      if (select && !std::regex_search(n, *select)) continue;
      params.emplace_back(n, item.value());
      taken[e.model].insert(n);
    }
    optimizers.push_back(make_optimizer(e.config, params, e.path));
    std::unique_ptr<LrScheduler> sched;
    if (e.config.scheduler) {
      try {
        sched = make_lr_scheduler(*e.config.scheduler, *optimizers.back(), total_steps);
      } catch (const ConfigError& err) {
        throw ConfigError(e.scheduler_path + ": " + err.what());
      }
    }
    schedulers.push_back(std::move(sched));
  }
  optimizers_ = std::move(optimizers);
  schedulers_ = std::move(schedulers);
  optimizer_horizon_ = total_steps;
  apply_pending_optimizer_state();
}

PrecisionPlugin* TrainingStrategy::precision_plugin() const {
  if (precision_hook_) return &precision_hook_->plugin();
  return precision_.get();
}

at::ScalarType TrainingStrategy::batch_dtype() const {
  if (precision_) return precision_->input_dtype();
  return options_.dtype;
}

void TrainingStrategy::ensure_precision_hook() {
  if (!precision_) return;
  if (precision_hook_) {
    if (precision_hook_->mode() != precision_->mode()) {
      throw ConfigError("training.precision is '" + precision_->name() +
                        "' but the registered MixedPrecisionHook uses '" +
                        precision_hook_->plugin().name() + "'; they must match");
    }
    return;
  }
  if (!precision_->autocast_dtype()) return;  // only the mixed modes need the hook
  register_hook(std::make_shared<MixedPrecisionHook>(precision_));  // drives this plugin
}

void TrainingStrategy::ensure_data_parallel_hook() {
  if (!options_.communicator || options_.communicator->size() <= 1) return;
  for (const auto& h : registered_hooks()) {
    if (dynamic_cast<DataParallelHook*>(h.get())) return;
  }
  DataParallelOptions o;
  o.bucket_cap_mb = options_.bucket_cap_mb;
  register_hook(std::make_shared<DataParallelHook>(options_.communicator, o));
}

void TrainingStrategy::ensure_non_finite_loss_guard() {
  if (!options_.stop_on_non_finite) return;
  // A plain hook that owns a DO stage cannot share it with an orchestrator:
  // it then owns what happens to non-finite losses too.
  if (!update_orchestrator() && (has_do_backward_ || has_do_optimizer_step_)) return;
  for (const auto& h : registered_hooks()) {
    if (dynamic_cast<SpikeSkippingHook*>(h.get()) || dynamic_cast<NonFiniteLossGuard*>(h.get())) return;
  }
  register_hook(std::make_shared<NonFiniteLossGuard>());
}

void TrainingStrategy::agree_on_stop_request() {
  if (!options_.communicator || options_.communicator->size() <= 1) {
    stop_agreed_ = stop_requested_;
  } else if (reduced_stop_) {
    stop_agreed_ = *reduced_stop_;  // rode in this batch's gradient all-reduce
  } else {
    at::Tensor flag = at::full({1}, stop_requested_ ? 1.0 : 0.0, at::kDouble);
    options_.communicator->allreduce_sum(flag);
    stop_agreed_ = flag.item<double>() > 0.0;
  }
  reduced_stop_.reset();
}

void TrainingStrategy::dispatch_stage(TrainingStage stage) {
  TrainContext ctx = make_context(nullptr);
  run_hooks(stage, ctx);
}

TrainContext TrainingStrategy::make_after_batch_context() {
  TrainContext ctx = make_context(last_batch_ ? &*last_batch_ : nullptr);
  if (last_losses_) {
    ctx.loss = last_losses_->total;
    ctx.losses = &*last_losses_;
  }
  return ctx;
}

TrainContext TrainingStrategy::make_context(const Batch* batch) {
  TrainContext ctx;
  ctx.strategy = this;
  ctx.batch = batch;
  ctx.model = model_.get();
  for (auto& [name, m] : models_) ctx.models[name] = m.get();
  ctx.optimizers = optimizers();
  ctx.lr_schedulers = lr_schedulers();
  ctx.precision = precision_plugin();
  ctx.global_rank = global_rank;
  return ctx;
}

void TrainingStrategy::run_hooks(TrainingStage stage, TrainContext& ctx) {
  if (hooks_.empty()) return;
  ctx.step_count = step_count;
  ctx.global_step_count = global_step_count;
  ctx.batch_count = batch_count;
  ctx.epoch_count = epoch_count;
  ctx.epoch_step_count = epoch_step_count;
  ctx.validation = last_validation_ ? &*last_validation_ : nullptr;
  for (const auto& h : hooks_) {
    if (!h->runs_on_stage(stage)) continue;
    if (step_count % h->frequency() != 0) continue;
    (*h)(ctx, stage);
  }
}

void TrainingStrategy::enter_hooks() { enter_in_order(hooks_); }

void TrainingStrategy::exit_hooks(bool failed) {
  // After a failure the original exception wins over one from an exit().
  exit_in_reverse(hooks_, failed, /*rethrow=*/!failed);
}

void TrainingStrategy::train_batch(const Batch& batch) {
  ensure_precision_hook();
  ensure_data_parallel_hook();
  ensure_non_finite_loss_guard();
  // Backward and the optimizer too, not only compute_outputs (common/denormals.h).
  const DenormalFlushGuard flush;
  RunScope scope(*this);
  enter_hooks();
  try {
    TrainContext setup_ctx = make_context(nullptr);
    run_hooks(TrainingStage::SETUP, setup_ctx);  // seed 002: on every call
    ensure_optimizer(options_.num_steps.value_or(0), /*for_run=*/false);
    set_configured_models_training();
    train_batch_impl(convert_batch(batch));
  } catch (...) {
    exit_hooks(true);
    throw;
  }
  exit_hooks(false);
}

void TrainingStrategy::train_batch_impl(const Batch& batch) {
  TrainContext ctx = make_context(&batch);
  run_hooks(TrainingStage::BEFORE_BATCH, ctx);
  // Seed 002: only an update orchestrator (which zeroes unless one of its
  // hooks vetoes BEFORE_BATCH) takes zero_grad over.
  if (!has_update_orchestrator_) {
    for (auto& o : optimizers_) o->zero_grad();
  }
  zero_optimizer_filtered_gradients();
  // Seed 004 forward_context: the MixedPrecisionHook holds it when there is
  // one; otherwise the strategy's plugin's, from the forward to backward.
  std::unique_ptr<AutocastGuard> region;
  if (precision_ && !precision_hook_) region = precision_->forward_context(options_.device);
  run_hooks(TrainingStage::BEFORE_FORWARD, ctx);
  ModelOutputs predictions = training_fn_(ctx.models, batch);
  if (precision_) predictions = precision_->convert_output(predictions);  // seed 004
  ctx.predictions = &predictions;
  run_hooks(TrainingStage::AFTER_FORWARD, ctx);
  run_hooks(TrainingStage::BEFORE_LOSS, ctx);
  loss_.set_progress(step_count, epoch_count);  // loss-weight schedules
  LossOutput losses = loss_(predictions, batch);
  ctx.loss = losses.total;
  ctx.losses = &losses;
  run_hooks(TrainingStage::AFTER_LOSS, ctx);
  run_hooks(TrainingStage::BEFORE_BACKWARD, ctx);
  region.reset();  // backward runs outside autocast (seed 000)
  // Seed 004 pre_backward: the MixedPrecisionHook calls it when there is one.
  if (precision_ && !precision_hook_) ctx.loss = precision_->pre_backward(ctx.loss);
  if (has_do_backward_) {
    run_hooks(TrainingStage::DO_BACKWARD, ctx);
  } else {
    plain_backward(ctx.loss, trainable_parameters(ctx));
  }
  // From here on hooks see detached values only.
  LossOutput detached = detach_losses(losses);
  ModelOutputs detached_predictions = detach_outputs(predictions);
  ctx.loss = detached.total;
  ctx.losses = &detached;
  ctx.predictions = &detached_predictions;
  losses = LossOutput{};
  predictions = ModelOutputs{};
  // Seed 002: the stages after the batch (AFTER_EPOCH, AFTER_VALIDATION,
  // AFTER_TRAINING) see the last batch and its detached loss.
  last_batch_ = batch;
  last_losses_ = detached;
  run_hooks(TrainingStage::AFTER_BACKWARD, ctx);
  run_hooks(TrainingStage::BEFORE_OPTIMIZER_STEP, ctx);
  bool step_ran = true;
  ctx.optimizer_step_skipped = false;
  if (has_do_optimizer_step_) {
    run_hooks(TrainingStage::DO_OPTIMIZER_STEP, ctx);
    step_ran = !ctx.optimizer_step_skipped;
  } else {
    plain_optimizer_step();
  }
  optimizer_step_skipped_ = !step_ran;
  batches_without_step_ = step_ran ? 0 : batches_without_step_ + 1;
  if (options_.max_batches_without_step > 0 && batches_without_step_ >= options_.max_batches_without_step) {
    request_stop(std::to_string(batches_without_step_) +
                 " batches in a row ended without an optimizer step (every step was skipped: "
                 "non-finite or spiking losses, or gradient-scaler overflows), so training cannot "
                 "make progress; the last at step " + std::to_string(step_count) + ", epoch " +
                 std::to_string(epoch_count));
  }
  run_hooks(TrainingStage::AFTER_OPTIMIZER_STEP, ctx);
  ++batch_count;
  ++epoch_step_count;
  if (step_ran) {
    ++step_count;
    global_step_count += world_size;
  }
  run_hooks(TrainingStage::AFTER_BATCH, ctx);
}

int64_t TrainingStrategy::target_step_count(int64_t batches_per_epoch) const {
  if (options_.num_steps) return *options_.num_steps;
  if (batches_per_epoch <= 0) {
    throw std::invalid_argument(
        "data loader must contain at least one batch when num_epochs is set, got 0 batches");
  }
  return static_cast<int64_t>(std::ceil(static_cast<double>(*options_.num_epochs) *
                                        static_cast<double>(batches_per_epoch) *
                                        options_.epoch_step_modifier));
}

bool TrainingStrategy::validation_due_after_epoch() const {
  if (!options_.validation) return false;
  // Seed 002: a step cadence takes precedence over the epoch cadence.
  if (options_.validation->every_n_steps > 0) return false;
  const int64_t n = options_.validation->every_n_epochs;
  return n > 0 && epoch_count > 0 && epoch_count % n == 0;
}

void TrainingStrategy::maybe_validate_after_step() {
  if (!options_.validation || optimizer_step_skipped_) return;
  const int64_t n = options_.validation->every_n_steps;
  if (n > 0 && step_count > 0 && step_count % n == 0) validate_and_step_metric_schedulers();
}

void TrainingStrategy::validate_and_step_metric_schedulers() {
  const ValidationSummary summary = validate();
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    LrScheduler* sched = schedulers_[i].get();
    if (!sched || !sched->metric_driven()) continue;
    // Seed 002: the optimizer config's metric adapter, else the monitor key
    // (checked at construction).
    const auto& adapter = entries_.at(i).config.scheduler_metric;
    sched->step(adapter ? adapter(summary) : validation_monitor_value(summary, sched->monitor()));
  }
}

ValidationSummary TrainingStrategy::validate() {
  if (!options_.validation) {
    throw std::logic_error("TrainingStrategy::validate() requires a validation config");
  }
  const auto& v = *options_.validation;
  EvaluateOptions eo;
  eo.batch_size = v.batch_size;
  eo.dtype = batch_dtype();
  eo.stress = true;
  eo.communicator = options_.communicator.get();
  eo.precision = precision_.get();  // seed 004 convert_input / convert_output
  {
    // Seed 000: validation runs under the hook's inference autocast.
    std::unique_ptr<AutocastGuard> autocast;
    if (v.use_mixed_precision != ValidationPrecision::kNever && precision_hook_) {
      autocast = precision_hook_->inference_context(options_.device);
    } else if (v.use_mixed_precision != ValidationPrecision::kNever && precision_) {
      autocast = precision_->forward_context(options_.device);
    } else if (v.use_mixed_precision == ValidationPrecision::kAlways) {
      throw std::logic_error("validation.use_mixed_precision = always, but no "
                             "MixedPrecisionHook is registered");
    }
    if (v.compute_loss) {
      loss_.set_progress(step_count, epoch_count);
      eo.loss = &loss_;
    }
    const std::shared_ptr<EnergyModel> inference = inference_model();
    const bool use_inference = v.use_ema && inference != nullptr;
    last_validation_ =
        evaluate_model(use_inference ? *inference : *model_, *v.data, options_.device, eo);
    last_validation_->inference_model = use_inference;
  }
  TrainContext ctx = make_after_batch_context();
  run_hooks(TrainingStage::AFTER_VALIDATION, ctx);
  return *last_validation_;
}

void TrainingStrategy::run_end_stage() {
  TrainContext end_ctx = make_after_batch_context();
  run_hooks(TrainingStage::AFTER_TRAINING, end_ctx);
  if (options_.validation) validate_and_step_metric_schedulers();
  end_stage_done_ = true;  // before the end checkpoint, which records it
  at_boundary(Boundary::kEnd);
}

void TrainingStrategy::run(DataLoader& given_loader) {
  stop_requested_ = stop_agreed_ = stopped_early_ = false;
  stop_reason_.clear();
  last_batch_.reset();
  last_losses_.reset();
  batches_without_step_ = 0;
  reduced_stop_.reset();
  ensure_precision_hook();
  ensure_data_parallel_hook();
  ensure_non_finite_loss_guard();
  // Backward and the optimizer too, not only compute_outputs (common/denormals.h).
  const DenormalFlushGuard flush;
  RunScope scope(*this);
  enter_hooks();
  try {
    TrainContext setup_ctx = make_context(nullptr);
    setup_ctx.active_dataloader = &given_loader;
    run_hooks(TrainingStage::SETUP, setup_ctx);
    if (!setup_ctx.active_dataloader) {
      throw std::invalid_argument("a SETUP hook set ctx.active_dataloader to null; it must point "
                                  "to the data loader to train on");
    }
    DataLoader& loader = *setup_ctx.active_dataloader;  // seed 002 active_dataloader
    active_dataloader_ = &loader;
    const int64_t batches_per_epoch = loader.size();
    int64_t target = target_step_count(batches_per_epoch);
    if (saved_world_size_) {
      // Resumed with another world size (issue 6): the saved position counts
      // batches of saved_world_size_ workers. The epoch continues after the
      // structures they consumed (all their batches so far were full), and
      // an epoch-count target counts the batches actually left.
      const int64_t consumed = std::min<int64_t>(
          loader.epoch_size(),
          epoch_step_count * loader.options().batch_size * *saved_world_size_);
      if (epoch_step_count > 0) {
        loader.set_resume_offset(epoch_count, consumed);
        epoch_step_count = loader.first_batch(epoch_count);
      }
      batch_count = epoch_count * batches_per_epoch + epoch_step_count;
      if (options_.num_epochs) {
        const int64_t left = (batches_per_epoch - epoch_step_count) +
                             (*options_.num_epochs - epoch_count - 1) * batches_per_epoch;
        target = step_count + static_cast<int64_t>(std::ceil(
                                  static_cast<double>(left) * options_.epoch_step_modifier));
      }
      saved_world_size_.reset();
    }
    // Finished early (request_finish, possibly before a restore): no more steps.
    if (finished_early_at_step_ >= 0) target = std::min(target, finished_early_at_step_);
    // Resumed from a checkpoint taken at the last step but before the end
    // stage (AFTER_TRAINING, the final validation, the end checkpoint):
    // run that stage now, so a run killed in between ends as an
    // uninterrupted one does (issue 15).
    const bool end_stage_pending = step_count >= target && step_count > 0 && !end_stage_done_;
    if (step_count < target) end_stage_done_ = false;  // more steps: the end stage runs again
    if (step_count < target || end_stage_pending) {
      prepare_restart_counters(batches_per_epoch);
      ensure_optimizer(target, /*for_run=*/true);
    }
    if (end_stage_pending) run_end_stage();
    if (step_count < target) {
      set_configured_models_training();
      bool started = false;
      while (step_count < target) {
        loader.set_epoch(epoch_count);
        loader.set_epoch_step(epoch_step_count);
        const int64_t start = loader.take_start_step();
        bool processed = false;
        bool epoch_done = false;
        for (int64_t k = start; k < batches_per_epoch; ++k) {
          if (step_count >= target) break;
          Batch batch = convert_batch(loader.batch(k));
          TrainContext ctx = make_context(&batch);
          if (!started) {
            run_hooks(TrainingStage::BEFORE_TRAINING, ctx);
            started = true;
          }
          if (epoch_step_count == 0) run_hooks(TrainingStage::BEFORE_EPOCH, ctx);
          train_batch_impl(batch);
          maybe_validate_after_step();
          if (finished_early_at_step_ >= 0) target = std::min(target, step_count);
          set_configured_models_training();
          agree_on_stop_request();  // every worker stops at the same batch
          processed = true;
          if (epoch_step_count >= batches_per_epoch) {
            epoch_done = true;
            break;
          }
          if (stop_agreed_) break;
          at_boundary(Boundary::kBatch);
        }
        if (!processed && step_count < target) {
          throw std::invalid_argument(
              "data loader produced no batches before reaching the target step count; it must "
              "be non-empty and compatible with the restored epoch_step_count");
        }
        if (epoch_done) {
          ++epoch_count;
          epoch_step_count = 0;
          TrainContext ctx = make_after_batch_context();
          run_hooks(TrainingStage::AFTER_EPOCH, ctx);
          if (validation_due_after_epoch()) validate_and_step_metric_schedulers();
          set_configured_models_training();
          if (finished_early_at_step_ >= 0) target = std::min(target, step_count);
        }
        if (stop_agreed_ && step_count < target) {
          stopped_early_ = true;
          at_boundary(Boundary::kStop);
          break;
        }
        if (epoch_done) at_boundary(Boundary::kEpoch);
      }
      if (!stopped_early_) run_end_stage();
    }
  } catch (...) {
    active_dataloader_ = nullptr;
    exit_hooks(true);
    if (PrecisionPlugin* plugin = precision_plugin()) plugin->teardown();
    throw;
  }
  active_dataloader_ = nullptr;
  exit_hooks(false);
  if (PrecisionPlugin* plugin = precision_plugin()) plugin->teardown();  // seed 004, last
}

void TrainingStrategy::prepare_restart_counters(int64_t batches_per_epoch) {
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"step_count", step_count},
        {"global_step_count", global_step_count}, {"batch_count", batch_count},
        {"epoch_count", epoch_count}, {"epoch_step_count", epoch_step_count}}) {
    if (value < 0) {
      throw std::invalid_argument(std::string("restart counter ") + name +
                                  " must be >= 0, got " + std::to_string(value));
    }
  }
  if (global_step_count == 0 && step_count > 0) global_step_count = step_count * world_size;
  if (batches_per_epoch <= 0) return;
  // Seed 002 _prepare_epoch_step_count.
  if (epoch_step_count >= batches_per_epoch) {
    epoch_count += epoch_step_count / batches_per_epoch;
    epoch_step_count %= batches_per_epoch;
  }
  const int64_t completed = epoch_count * batches_per_epoch;
  const int64_t progress = batch_count != 0 ? batch_count : step_count;
  if (epoch_step_count > 0) {
    const int64_t expected = completed + epoch_step_count;
    if (progress != 0 && progress != expected) {
      throw std::invalid_argument(
          "restart counters are inconsistent: batch_count (or step_count when batch_count is 0) "
          "must equal epoch_count * len(loader) + epoch_step_count = " +
          std::to_string(expected) + ", got " + std::to_string(progress));
    }
    batch_count = std::max(batch_count, expected);
    return;
  }
  if (progress < completed) {
    throw std::invalid_argument(
        "restart counters are inconsistent: batch_count (or step_count when batch_count is 0) "
        "must be >= epoch_count * len(loader) = " +
        std::to_string(completed) + ", got " + std::to_string(progress));
  }
  // The position in the epoch follows from the batches done.
  const int64_t elapsed = progress - completed;
  epoch_count += elapsed / batches_per_epoch;
  epoch_step_count = elapsed % batches_per_epoch;
  batch_count = std::max(batch_count, progress);
}

Batch TrainingStrategy::convert_batch(const Batch& batch) const {
  if (!precision_) return batch.to(options_.device, options_.dtype);
  return keep_geometry_float32(precision_->convert_input(batch, options_.device));
}

void TrainingStrategy::plain_backward(const at::Tensor& loss, const std::vector<at::Tensor>& parameters) {
  PrecisionPlugin* plugin = precision_plugin();
  if (!plugin) {
    backward_into(loss, parameters);
    return;
  }
  plugin->backward(loss, parameters);
  plugin->post_backward(loss);
}

void TrainingStrategy::plain_optimizer_step() {
  PrecisionPlugin* plugin = precision_plugin();
  std::vector<bool> skipped;
  for (auto& o : optimizers_) skipped.push_back(plugin ? !plugin->optimizer_step(*o) : (o->step(), false));
  step_lr_schedulers(lr_schedulers(), skipped);  // seed 001: held where the step was skipped
}

std::set<const void*> TrainingStrategy::optimizer_owned_parameters() const {
  std::set<const void*> owned;
  for (const auto& o : optimizers_) {
    for (const auto& g : o->param_groups()) {
      for (const auto& p : g.params()) owned.insert(p.unsafeGetTensorImpl());
    }
  }
  return owned;
}

void TrainingStrategy::zero_optimizer_filtered_gradients() {
  // Seed 002 _zero_optimizer_filtered_gradients: a trainable parameter that
  // no optimizer owns would otherwise accumulate a gradient over the run
  // and carry it into every checkpoint.
  const std::set<const void*> owned = optimizer_owned_parameters();
  for (auto& [name, m] : models_) {
    for (auto& p : m->module().parameters(true)) {
      if (p.requires_grad() && p.grad().defined() && owned.count(p.unsafeGetTensorImpl()) == 0) {
        p.mutable_grad() = at::Tensor();
      }
    }
  }
}

}  // namespace crucible
