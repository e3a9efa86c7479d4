#include "crucible/training/strategy.h"

#include "crucible/common/error.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace crucible {

namespace {

void check_optimizer_config(const OptimizerConfig& c) {
  auto bad = [](const std::string& key, const std::string& expected, double got) {
    std::ostringstream os;
    os << "training.optimizer." << key << " must be " << expected << ", got " << got;
    throw ConfigError(os.str());
  };
  if (c.name != "adam" && c.name != "adamw") {
    throw ConfigError("training.optimizer.name must be one of adam, adamw, got '" + c.name + "'");
  }
  if (!(c.lr > 0.0) || !std::isfinite(c.lr)) bad("lr", "a finite number > 0", c.lr);
  if (!(c.weight_decay >= 0.0)) bad("weight_decay", ">= 0", c.weight_decay);
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0)) bad("beta1", "in [0, 1)", c.beta1);
  if (!(c.beta2 >= 0.0 && c.beta2 < 1.0)) bad("beta2", "in [0, 1)", c.beta2);
  if (!(c.eps > 0.0)) bad("eps", "> 0", c.eps);
}

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

}  // namespace

TrainingStrategy::TrainingStrategy(std::shared_ptr<EnergyModel> model, StrategyOptions options,
                                   WeightedSumLoss loss, std::vector<std::shared_ptr<Hook>> hooks,
                                   TrainingFn training_fn)
    : model_(std::move(model)),
      options_(std::move(options)),
      loss_(std::move(loss)),
      training_fn_(std::move(training_fn)) {
  if (!model_) throw ConfigError("model must be set, got null");
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
  check_optimizer_config(options_.optimizer);
  if (options_.validation) {
    const auto& v = *options_.validation;
    if (!v.data || v.data->size() == 0) {
      throw ConfigError("validation data must contain at least one structure, got none");
    }
    if (v.every_n_epochs < 0 || v.every_n_steps < 0) {
      throw ConfigError("validation.every_n_epochs and every_n_steps must be >= 0");
    }
  }
  if (options_.scheduler) {
    // Check the scheduler options now, before any training (seed 002).
    torch::optim::SGD probe(std::vector<at::Tensor>{at::zeros({1})}, torch::optim::SGDOptions(1.0));
    try {
      (void)make_lr_scheduler(*options_.scheduler, probe, 1);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("training.scheduler: ") + e.what());
    }
    if (options_.scheduler->name == "plateau") {
      if (!options_.validation) {
        throw ConfigError("training.scheduler: the plateau scheduler steps on a validation "
                          "metric and needs a validation config, got none");
      }
      std::string key = options_.scheduler->plateau.monitor;
      if (key.rfind("val/", 0) == 0) key = key.substr(4);
      const auto metrics = ValidationSummary{}.as_map();
      if (metrics.count(key) == 0) {
        std::string known;
        for (const auto& [k, v] : metrics) known += (known.empty() ? "" : ", ") + k;
        throw ConfigError("training.scheduler.monitor must be a validation metric (" + known +
                          "), optionally prefixed with val/, got '" +
                          options_.scheduler->plateau.monitor + "'");
      }
    }
  }
  if (!training_fn_) {
    const bool forces = loss_.needs_forces();
    const bool stress = loss_.needs_stress();
    training_fn_ = [forces, stress](EnergyModel& m, const Batch& b) {
      ComputeOptions co;
      co.forces = forces;
      co.stress = stress && b.has_stress.any().item<bool>();
      co.training = true;
      return compute_outputs(m, b, co);
    };
  }
  if (!options_.precision.empty()) {
    precision_ = make_precision_plugin(options_.precision);  // ConfigError on a bad mode
    model_->module().to(options_.device);
    precision_->convert_module(model_->module());
  } else {
    model_->module().to(options_.device, options_.dtype);
  }
  install_hooks(std::move(hooks));
}

TrainingStrategy::~TrainingStrategy() = default;

void TrainingStrategy::register_hook(std::shared_ptr<Hook> hook) {
  if (!hook) throw ConfigError("hooks must not contain null, got a null hook");
  auto candidate = hooks_;
  candidate.push_back(std::move(hook));
  install_hooks(std::move(candidate));
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
  has_do_backward_ = has_do_optimizer_step_ = false;
  for (const auto& h : hooks_) {
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
  if (!optimizer_) return {};
  return {optimizer_.get()};
}

std::vector<LrScheduler*> TrainingStrategy::lr_schedulers() {
  if (!optimizer_) return {};
  return {scheduler_.get()};
}

void TrainingStrategy::ensure_optimizer(int64_t total_steps) {
  if (optimizer_) return;
  std::vector<at::Tensor> params;
  for (auto& p : model_->module().parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (params.empty()) throw ConfigError("model has no trainable parameters");
  const auto& c = options_.optimizer;
  if (c.name == "adamw") {
    torch::optim::AdamWOptions o(c.lr);
    o.betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay).amsgrad(c.amsgrad);
    optimizer_ = std::make_unique<torch::optim::AdamW>(params, o);
  } else {
    torch::optim::AdamOptions o(c.lr);
    o.betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay).amsgrad(c.amsgrad);
    optimizer_ = std::make_unique<torch::optim::Adam>(params, o);
  }
  if (options_.scheduler) {
    try {
      scheduler_ = make_lr_scheduler(*options_.scheduler, *optimizer_, total_steps);
    } catch (const ConfigError& e) {
      optimizer_.reset();
      throw ConfigError(std::string("training.scheduler: ") + e.what());
    }
  }
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
  register_hook(std::make_shared<MixedPrecisionHook>(options_.precision));
}

TrainContext TrainingStrategy::make_context(const Batch* batch) {
  TrainContext ctx;
  ctx.strategy = this;
  ctx.batch = batch;
  ctx.model = model_.get();
  ctx.optimizers = optimizers();
  ctx.lr_schedulers = lr_schedulers();
  ctx.precision = precision_plugin();
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
  enter_hooks();
  try {
    ensure_optimizer(options_.num_steps.value_or(0));
    model_->module().train(true);
    train_batch_impl(batch.to(options_.device, batch_dtype()));
  } catch (...) {
    exit_hooks(true);
    throw;
  }
  exit_hooks(false);
}

void TrainingStrategy::train_batch_impl(const Batch& batch) {
  TrainContext ctx = make_context(&batch);
  run_hooks(TrainingStage::BEFORE_BATCH, ctx);
  if (!has_do_optimizer_step_) optimizer_->zero_grad();
  run_hooks(TrainingStage::BEFORE_FORWARD, ctx);
  ModelOutputs predictions = training_fn_(*model_, batch);
  ctx.predictions = &predictions;
  run_hooks(TrainingStage::AFTER_FORWARD, ctx);
  run_hooks(TrainingStage::BEFORE_LOSS, ctx);
  LossOutput losses = loss_(predictions, batch);
  ctx.loss = losses.total;
  ctx.losses = &losses;
  run_hooks(TrainingStage::AFTER_LOSS, ctx);
  run_hooks(TrainingStage::BEFORE_BACKWARD, ctx);
  if (has_do_backward_) {
    run_hooks(TrainingStage::DO_BACKWARD, ctx);
  } else {
    ctx.loss.backward();
  }
  // From here on hooks see detached values only.
  LossOutput detached = detach_losses(losses);
  ModelOutputs detached_predictions = detach_outputs(predictions);
  ctx.loss = detached.total;
  ctx.losses = &detached;
  ctx.predictions = &detached_predictions;
  losses = LossOutput{};
  predictions = ModelOutputs{};
  run_hooks(TrainingStage::AFTER_BACKWARD, ctx);
  run_hooks(TrainingStage::BEFORE_OPTIMIZER_STEP, ctx);
  bool step_ran = true;
  ctx.optimizer_step_skipped = false;
  if (has_do_optimizer_step_) {
    run_hooks(TrainingStage::DO_OPTIMIZER_STEP, ctx);
    step_ran = !ctx.optimizer_step_skipped;
  } else {
    optimizer_->step();
    step_lr_schedulers(ctx.lr_schedulers);
  }
  optimizer_step_skipped_ = !step_ran;
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
  if (!scheduler_ || !scheduler_->metric_driven()) return;
  const auto metrics = summary.as_map();
  std::string key = scheduler_->monitor();
  if (key.rfind("val/", 0) == 0) key = key.substr(4);
  auto it = metrics.find(key);
  if (it == metrics.end()) {
    std::string known;
    for (const auto& [k, v] : metrics) known += (known.empty() ? "" : ", ") + k;
    throw ConfigError("training.scheduler.monitor must be a validation metric (" + known +
                      "), got '" + scheduler_->monitor() + "'");
  }
  scheduler_->step(it->second);
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
  {
    // Seed 000: validation runs under the hook's inference autocast.
    std::unique_ptr<AutocastGuard> autocast;
    if (precision_hook_) autocast = precision_hook_->inference_context(options_.device);
    const bool use_inference = v.use_ema && inference_model_ != nullptr;
    last_validation_ =
        evaluate_model(use_inference ? *inference_model_ : *model_, *v.data, options_.device, eo);
    last_validation_->inference_model = use_inference;
  }
  TrainContext ctx = make_context(nullptr);
  run_hooks(TrainingStage::AFTER_VALIDATION, ctx);
  return *last_validation_;
}

void TrainingStrategy::run(DataLoader& loader) {
  ensure_precision_hook();
  enter_hooks();
  try {
    TrainContext setup_ctx = make_context(nullptr);
    run_hooks(TrainingStage::SETUP, setup_ctx);
    const int64_t batches_per_epoch = loader.size();
    const int64_t target = target_step_count(batches_per_epoch);
    if (step_count < target) {
      // Restart: normalise epoch_step_count and check counter consistency (seed 002).
      if (batches_per_epoch > 0 && epoch_step_count >= batches_per_epoch) {
        epoch_count += epoch_step_count / batches_per_epoch;
        epoch_step_count %= batches_per_epoch;
      }
      const int64_t expected = epoch_count * batches_per_epoch + epoch_step_count;
      if (batch_count != 0 && batch_count != expected) {
        throw std::invalid_argument(
            "restart counters are inconsistent: batch_count must equal epoch_count * "
            "len(loader) + epoch_step_count = " +
            std::to_string(expected) + ", got " + std::to_string(batch_count));
      }
      batch_count = std::max(batch_count, expected);
      ensure_optimizer(target);
      model_->module().train(true);
      bool started = false;
      while (step_count < target) {
        loader.set_epoch(epoch_count);
        loader.set_epoch_step(epoch_step_count);
        const int64_t start = loader.take_start_step();
        bool processed = false;
        bool epoch_done = false;
        for (int64_t k = start; k < batches_per_epoch; ++k) {
          if (step_count >= target) break;
          Batch batch = loader.batch(k).to(options_.device, batch_dtype());
          TrainContext ctx = make_context(&batch);
          if (!started) {
            run_hooks(TrainingStage::BEFORE_TRAINING, ctx);
            started = true;
          }
          if (epoch_step_count == 0) run_hooks(TrainingStage::BEFORE_EPOCH, ctx);
          train_batch_impl(batch);
          maybe_validate_after_step();
          model_->module().train(true);
          processed = true;
          if (epoch_step_count >= batches_per_epoch) {
            epoch_done = true;
            break;
          }
        }
        if (!processed && step_count < target) {
          throw std::invalid_argument(
              "data loader produced no batches before reaching the target step count; it must "
              "be non-empty and compatible with the restored epoch_step_count");
        }
        if (epoch_done) {
          ++epoch_count;
          epoch_step_count = 0;
          TrainContext ctx = make_context(nullptr);
          run_hooks(TrainingStage::AFTER_EPOCH, ctx);
          if (validation_due_after_epoch()) validate_and_step_metric_schedulers();
          model_->module().train(true);
        }
      }
      TrainContext end_ctx = make_context(nullptr);
      run_hooks(TrainingStage::AFTER_TRAINING, end_ctx);
      if (options_.validation) validate_and_step_metric_schedulers();
    }
  } catch (...) {
    exit_hooks(true);
    throw;
  }
  exit_hooks(false);
}

}  // namespace crucible
