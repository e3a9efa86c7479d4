#include "crucible/training/update_hook.h"

#include "crucible/precision/precision.h"

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <exception>
#include <map>
#include <set>
#include <stdexcept>

#include "crucible/common/error.h"
#include "crucible/training/lr_scheduler.h"

namespace crucible {

namespace {

constexpr std::array<TrainingStage, 4> kUpdateStages = {
    TrainingStage::BEFORE_BATCH,
    TrainingStage::DO_BACKWARD,
    TrainingStage::DO_OPTIMIZER_STEP,
    TrainingStage::AFTER_OPTIMIZER_STEP,
};

void check_optimizers(const TrainContext& ctx) {
  for (auto* opt : ctx.optimizers) {
    if (!opt)
      throw std::logic_error("TrainingUpdateOrchestrator: ctx.optimizers must not contain null");
  }
}

}  // namespace

const std::array<TrainingStage, 4>& training_update_stages() { return kUpdateStages; }

bool is_training_update_stage(TrainingStage stage) {
  return std::find(kUpdateStages.begin(), kUpdateStages.end(), stage) != kUpdateStages.end();
}

bool OptimizerStepReport::any_skipped() const {
  return std::any_of(skipped.begin(), skipped.end(), [](bool s) { return s; });
}

// ---------------------------------------------------------------- TrainingUpdateHook

UpdateDecision TrainingUpdateHook::operator()(TrainContext& ctx, TrainingStage stage,
                                              bool will_skip) {
  (void)stage;
  (void)will_skip;
  return {true, ctx.loss};
}

OptimizerStepReport TrainingUpdateHook::step_optimizers(TrainContext& ctx) {
  (void)ctx;
  throw std::logic_error("update hook '" + name() +
                         "' must override step_optimizers() when owns_optimizer_step() is true");
}

bool TrainingUpdateHook::runs_on_stage(TrainingStage stage) const {
  return stage == TrainingStage::SETUP || is_training_update_stage(stage);
}

void TrainingUpdateHook::operator()(TrainContext& ctx, TrainingStage stage) {
  (void)ctx;
  throw std::logic_error("update hook '" + name() + "' was called directly at " +
                         stage_name(stage) +
                         "; update hooks run inside a TrainingUpdateOrchestrator (register them "
                         "with TrainingStrategy::register_hook or compose them with +)");
}

LambdaUpdateHook::LambdaUpdateHook(std::string name, Fn fn, int priority,
                                   std::optional<std::string> exclusive_key)
    : name_(std::move(name)),
      fn_(std::move(fn)),
      priority_(priority),
      exclusive_key_(std::move(exclusive_key)) {
  if (!fn_)
    throw std::invalid_argument("update hook '" + name_ + "': fn must be callable, got empty");
}

// ---------------------------------------------------------------- TrainingUpdateOrchestrator

TrainingUpdateOrchestrator::TrainingUpdateOrchestrator(
    const std::vector<std::shared_ptr<Hook>>& parts) {
  std::vector<std::shared_ptr<TrainingUpdateHook>> flat;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& part = parts[i];
    if (!part) {
      throw ConfigError("update orchestrator part " + std::to_string(i) +
                        " must be a TrainingUpdateHook or TrainingUpdateOrchestrator, got null");
    }
    if (auto orch = std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(part)) {
      flat.insert(flat.end(), orch->hooks_.begin(), orch->hooks_.end());
    } else if (auto hook = std::dynamic_pointer_cast<TrainingUpdateHook>(part)) {
      flat.push_back(std::move(hook));
    } else {
      throw ConfigError("update orchestrator part " + std::to_string(i) +
                        " must be a TrainingUpdateHook or TrainingUpdateOrchestrator, got '" +
                        part->name() + "' (a plain Hook)");
    }
  }
  std::stable_sort(flat.begin(), flat.end(),
                   [](const auto& a, const auto& b) { return a->priority() < b->priority(); });
  std::map<std::string, const TrainingUpdateHook*> exclusive;
  const TrainingUpdateHook* owner = nullptr;
  for (const auto& h : flat) {
    if (auto key = h->exclusive_update_key()) {
      auto [it, inserted] = exclusive.emplace(*key, h.get());
      if (!inserted) {
        throw ConfigError("update hooks with exclusive key '" + *key +
                          "' must appear at most once in an orchestrator, got 2: '" +
                          it->second->name() + "' and '" + h->name() + "'");
      }
    }
    if (h->owns_optimizer_step()) {
      if (owner) {
        throw ConfigError(
            "at most one update hook may own the optimizer step (owns_optimizer_step), got 2: '" +
            owner->name() + "' and '" + h->name() + "'");
      }
      owner = h.get();
    }
  }
  hooks_ = std::move(flat);
}

bool TrainingUpdateOrchestrator::runs_on_stage(TrainingStage stage) const {
  return stage == TrainingStage::SETUP || is_training_update_stage(stage);
}

bool TrainingUpdateOrchestrator::run_gated_stage(TrainContext& ctx, TrainingStage stage) {
  bool should_run = true;
  for (const auto& h : hooks_) {
    const UpdateDecision d = (*h)(ctx, stage, !should_run);
    should_run = should_run && d.proceed;
  }
  return should_run;
}

bool TrainingUpdateOrchestrator::step(TrainContext& ctx) {
  check_optimizers(ctx);
  TrainingUpdateHook* owner = nullptr;
  for (const auto& h : hooks_) {
    if (!h->owns_optimizer_step()) continue;
    if (owner) {
      throw std::logic_error("at most one update hook may own the optimizer step, got 2: '" +
                             owner->name() + "' and '" + h->name() + "'");
    }
    owner = h.get();
  }
  OptimizerStepReport report;
  if (owner) {
    report = owner->step_optimizers(ctx);
    if (report.skipped.size() != ctx.optimizers.size()) {
      throw std::logic_error("update hook '" + owner->name() +
                             "': step_optimizers() must report one entry per optimizer (" +
                             std::to_string(ctx.optimizers.size()) + "), got " +
                             std::to_string(report.skipped.size()));
    }
  } else {
    // Seed 004: the precision plugin steps each optimizer.
    for (auto* opt : ctx.optimizers) {
      report.skipped.push_back(ctx.precision ? !ctx.precision->optimizer_step(*opt)
                                             : (opt->step(), false));
    }
  }
  // Seed 001: a scheduler steps only if its optimizer's step ran.
  step_lr_schedulers(ctx.lr_schedulers, report.skipped);
  return !report.any_skipped();
}

void TrainingUpdateOrchestrator::operator()(TrainContext& ctx, TrainingStage stage) {
  switch (stage) {
    case TrainingStage::SETUP:
      for (const auto& h : hooks_) (*h)(ctx, stage, false);
      break;
    case TrainingStage::BEFORE_BATCH:
      if (run_gated_stage(ctx, stage)) {
        check_optimizers(ctx);
        for (auto* opt : ctx.optimizers) opt->zero_grad();
      }
      break;
    case TrainingStage::DO_BACKWARD: {
      for (const auto& h : hooks_) {
        UpdateDecision d = (*h)(ctx, stage, false);
        if (!d.loss.defined()) {
          throw std::logic_error("update hook '" + h->name() +
                                 "' must return a defined loss at DO_BACKWARD, got an undefined "
                                 "tensor");
        }
        ctx.loss = std::move(d.loss);
      }
      if (!ctx.loss.defined()) {
        throw std::logic_error(
            "TrainingUpdateOrchestrator needs a defined ctx.loss at DO_BACKWARD, got an "
            "undefined tensor");
      }
      if (ctx.precision) {  // seed 004: the plugin runs backward
        ctx.precision->backward(ctx.loss, trainable_parameters(ctx));
        ctx.precision->post_backward(ctx.loss);
      } else {
        backward_into(ctx.loss, trainable_parameters(ctx));
      }
      break;
    }
    case TrainingStage::DO_OPTIMIZER_STEP: {
      bool ran = run_gated_stage(ctx, stage);
      if (ran) ran = step(ctx);
      optimizer_step_skipped_ = !ran;
      ctx.optimizer_step_skipped = !ran;
      break;
    }
    case TrainingStage::AFTER_OPTIMIZER_STEP:
      for (const auto& h : hooks_) (*h)(ctx, stage, optimizer_step_skipped_);
      break;
    default:
      break;  // not an orchestrator stage (seed 001: no-op)
  }
}

void TrainingUpdateOrchestrator::enter() { enter_in_order(hooks_); }

void TrainingUpdateOrchestrator::exit(bool failed) {
  exit_in_reverse(hooks_, failed, /*rethrow=*/true);
}

void TrainingUpdateOrchestrator::close() {
  std::exception_ptr first;
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) {
    try {
      (*it)->close();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---------------------------------------------------------------- composition

std::shared_ptr<TrainingUpdateOrchestrator> operator+(
    const std::shared_ptr<TrainingUpdateHook>& a, const std::shared_ptr<TrainingUpdateHook>& b) {
  return std::make_shared<TrainingUpdateOrchestrator>(std::vector<std::shared_ptr<Hook>>{a, b});
}

std::shared_ptr<TrainingUpdateOrchestrator> operator+(
    const std::shared_ptr<TrainingUpdateOrchestrator>& a,
    const std::shared_ptr<TrainingUpdateHook>& b) {
  return std::make_shared<TrainingUpdateOrchestrator>(std::vector<std::shared_ptr<Hook>>{a, b});
}

std::shared_ptr<TrainingUpdateOrchestrator> operator+(
    const std::shared_ptr<TrainingUpdateHook>& a,
    const std::shared_ptr<TrainingUpdateOrchestrator>& b) {
  return std::make_shared<TrainingUpdateOrchestrator>(std::vector<std::shared_ptr<Hook>>{a, b});
}

std::shared_ptr<TrainingUpdateOrchestrator> operator+(
    const std::shared_ptr<TrainingUpdateOrchestrator>& a,
    const std::shared_ptr<TrainingUpdateOrchestrator>& b) {
  return std::make_shared<TrainingUpdateOrchestrator>(std::vector<std::shared_ptr<Hook>>{a, b});
}

// ---------------------------------------------------------------- strategy helpers (seed 002)

std::vector<std::shared_ptr<Hook>> flatten_registered_hooks(
    const std::vector<std::shared_ptr<Hook>>& hooks) {
  std::vector<std::shared_ptr<Hook>> out;
  for (const auto& h : hooks) {
    out.push_back(h);
    if (auto orch = std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(h)) {
      out.insert(out.end(), orch->hooks().begin(), orch->hooks().end());
    }
  }
  return out;
}

std::vector<std::shared_ptr<Hook>> fold_training_update_hooks(
    const std::vector<std::shared_ptr<Hook>>& hooks) {
  std::vector<std::shared_ptr<Hook>> others;
  std::vector<std::shared_ptr<Hook>> update;
  std::optional<size_t> insert_at;
  int n_orchestrators = 0;
  for (const auto& h : hooks) {
    if (!h) throw ConfigError("hooks must not contain null, got a null hook");
    const bool is_orch = std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(h) != nullptr;
    const bool is_update = is_orch || std::dynamic_pointer_cast<TrainingUpdateHook>(h) != nullptr;
    if (!is_update) {
      others.push_back(h);
      continue;
    }
    if (!insert_at) insert_at = others.size();
    update.push_back(h);
    n_orchestrators += is_orch ? 1 : 0;
  }
  if (update.empty()) return hooks;
  if (n_orchestrators > 1) {
    throw ConfigError("hooks must contain at most one TrainingUpdateOrchestrator, got " +
                      std::to_string(n_orchestrators) +
                      "; compose update hooks with + before registration");
  }
  std::shared_ptr<Hook> folded;
  if (update.size() == 1 && n_orchestrators == 1) {
    folded = update.front();
  } else {
    folded = std::make_shared<TrainingUpdateOrchestrator>(update);
  }
  others.insert(others.begin() + static_cast<std::ptrdiff_t>(*insert_at), folded);
  return others;
}

std::vector<std::shared_ptr<Hook>> order_update_orchestrator_before_dependent_hooks(
    const std::vector<std::shared_ptr<Hook>>& hooks) {
  std::vector<std::shared_ptr<Hook>> out = hooks;
  auto orch = std::find_if(out.begin(), out.end(), [](const auto& h) {
    return std::dynamic_pointer_cast<TrainingUpdateOrchestrator>(h) != nullptr;
  });
  if (orch == out.end()) return out;
  auto dependent = std::find_if(out.begin(), orch, [](const auto& h) {
    return h->requires_update_orchestrator_before(TrainingStage::AFTER_OPTIMIZER_STEP);
  });
  if (dependent == orch) return out;
  std::rotate(dependent, orch, orch + 1);
  return out;
}

std::vector<at::Tensor> optimizer_parameters(const TrainContext& ctx) {
  std::vector<at::Tensor> params;
  std::set<const void*> seen;
  for (auto* opt : ctx.optimizers) {
    if (!opt) continue;
    // Seed 004 main_params: the plugin says which tensors the step updates.
    std::vector<at::Tensor> mine;
    if (ctx.precision) {
      mine = ctx.precision->main_params(*opt);
    } else {
      for (const auto& group : opt->param_groups()) {
        for (const auto& p : group.params()) mine.push_back(p);
      }
    }
    for (const auto& p : mine) {
      if (p.defined() && seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
    }
  }
  return params;
}

}  // namespace crucible
