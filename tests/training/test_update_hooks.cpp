// Contracts of TrainingUpdateHook / TrainingUpdateOrchestrator (seed 001) and
// of their registration on TrainingStrategy (seed 002): priority order, `+`
// flattening, exclusive keys, any-veto-wins gating, loss threading, skipped
// steps, folding, DO-stage claims, ordering before dependent hooks, SETUP.

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <map>
#include <string>
#include <vector>

#include "crucible/common/error.h"
#include "crucible/training/strategy.h"
#include "crucible/training/update_hook.h"
#include "toy_model.h"
#include "training_helpers.h"

namespace crucible {
namespace {

using testing::params;
using testing::steps_options;
using testing::toy_structures;
using testing::energy_forces_loss;
using testing::ToyModel;
using testing::toy_dataset;

/// One dispatch as a child saw it.
struct Call {
  std::string hook;
  TrainingStage stage;
  bool will_skip;
};

/// An update hook that logs every call into a shared log and, optionally,
/// vetoes some stages.
class LoggingUpdateHook : public TrainingUpdateHook {
 public:
  LoggingUpdateHook(std::string name, int priority, std::vector<Call>* log,
                    std::set<TrainingStage> veto = {})
      : name_(std::move(name)), priority_(priority), log_(log), veto_(std::move(veto)) {}
  std::string name() const override { return name_; }
  int priority() const override { return priority_; }
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override {
    if (log_) log_->push_back({name_, stage, will_skip});
    return {veto_.count(stage) == 0, ctx.loss};
  }
  void enter() override {
    if (log_) log_->push_back({"enter " + name_, TrainingStage::SETUP, false});
  }
  void exit(bool) override {
    if (log_) log_->push_back({"exit " + name_, TrainingStage::SETUP, false});
  }

 private:
  std::string name_;
  int priority_;
  std::vector<Call>* log_;
  std::set<TrainingStage> veto_;
};

std::shared_ptr<LoggingUpdateHook> logging(std::string name, int priority,
                                           std::vector<Call>* log = nullptr,
                                           std::set<TrainingStage> veto = {}) {
  return std::make_shared<LoggingUpdateHook>(std::move(name), priority, log, std::move(veto));
}

std::vector<std::string> names(const TrainingUpdateOrchestrator& o) {
  std::vector<std::string> out;
  for (const auto& h : o.hooks()) out.push_back(h->name());
  return out;
}

std::vector<std::string> names(const std::vector<std::shared_ptr<Hook>>& hooks) {
  std::vector<std::string> out;
  for (const auto& h : hooks) out.push_back(h->name());
  return out;
}

/// Calls at `stage`, in order, as "name:will_skip".
std::vector<std::string> calls_at(const std::vector<Call>& log, TrainingStage stage) {
  std::vector<std::string> out;
  for (const auto& c : log) {
    if (c.stage == stage && c.hook.rfind("enter ", 0) != 0 && c.hook.rfind("exit ", 0) != 0) {
      out.push_back(c.hook + ":" + (c.will_skip ? "1" : "0"));
    }
  }
  return out;
}

/// Gradients of the toy model's (a, b, c).
std::vector<double> grads(ToyModel& m) {
  return {m->a.grad().item<double>(), m->b.grad().item<double>(), m->c.grad().item<double>()};
}

/// A plain hook that must run after the orchestrator at AFTER_OPTIMIZER_STEP.
class DependentHook : public Hook {
 public:
  explicit DependentHook(std::vector<Call>* log) : log_(log) {}
  std::string name() const override { return "dependent"; }
  bool runs_on_stage(TrainingStage s) const override {
    return s == TrainingStage::AFTER_OPTIMIZER_STEP;
  }
  void operator()(TrainContext& ctx, TrainingStage s) override {
    log_->push_back({"dependent", s, ctx.optimizer_step_skipped});
  }
  bool requires_update_orchestrator_before(TrainingStage s) const override {
    return s == TrainingStage::AFTER_OPTIMIZER_STEP;
  }

 private:
  std::vector<Call>* log_;
};

// ------------------------------------------------------------------ orchestrator

TEST(UpdateHooks, PriorityOrderWithStableTies) {
  std::vector<Call> log;
  TrainingUpdateOrchestrator o({logging("d1", update_priority::kDefault, &log),
                                logging("acc", update_priority::kGradientAccumulation, &log),
                                logging("d2", update_priority::kDefault, &log),
                                logging("clip", update_priority::kGradientClipping, &log),
                                logging("acc2", update_priority::kGradientAccumulation, &log)});
  const std::vector<std::string> expected = {"acc", "acc2", "clip", "d1", "d2"};
  EXPECT_EQ(names(o), expected);
  TrainContext ctx;
  o(ctx, TrainingStage::SETUP);
  EXPECT_EQ(calls_at(log, TrainingStage::SETUP),
            (std::vector<std::string>{"acc:0", "acc2:0", "clip:0", "d1:0", "d2:0"}));
  EXPECT_EQ(update_priority::kMixedPrecision, 20);
  EXPECT_EQ(update_priority::kSpikeSkipping, 40);
}

TEST(UpdateHooks, PlusFlattensNestedOrchestratorsInPriorityOrder) {
  auto a = logging("a", 40);
  auto b = logging("b", 10);
  auto c = logging("c", 30);
  auto d = logging("d", 10);
  auto e = logging("e", 20);
  auto ab = a + b;  // hook + hook
  auto cd = c + d;
  auto abcd = ab + cd;    // orchestrator + orchestrator
  auto abcde = abcd + e;  // orchestrator + hook
  auto eab = e + ab;      // hook + orchestrator
  EXPECT_EQ(names(*ab), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(names(*abcd), (std::vector<std::string>{"b", "d", "c", "a"}));
  EXPECT_EQ(names(*abcde), (std::vector<std::string>{"b", "d", "e", "c", "a"}));
  EXPECT_EQ(names(*eab), (std::vector<std::string>{"b", "e", "a"}));
  // The children are the original hook objects, not copies.
  EXPECT_EQ(abcde->hooks()[0], b);
  // Composition does not mutate its operands.
  EXPECT_EQ(ab->hooks().size(), 2u);
  // Composing with a plain Hook is rejected.
  auto plain =
      std::make_shared<LambdaHook>("plain", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
                                   [](TrainContext&, TrainingStage) {});
  try {
    TrainingUpdateOrchestrator bad({a, plain});
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_STREQ(err.what(),
                 "update orchestrator part 1 must be a TrainingUpdateHook or "
                 "TrainingUpdateOrchestrator, got 'plain' (a plain Hook)");
  }
}

TEST(UpdateHooks, ExclusiveKeyRejectedWithMessage) {
  auto noop = [](TrainContext& ctx, TrainingStage, bool) { return UpdateDecision{true, ctx.loss}; };
  auto mp1 = std::make_shared<LambdaUpdateHook>("mp1", noop, update_priority::kMixedPrecision,
                                                "MixedPrecisionHook");
  auto mp2 = std::make_shared<LambdaUpdateHook>("mp2", noop, update_priority::kMixedPrecision,
                                                "MixedPrecisionHook");
  auto other = std::make_shared<LambdaUpdateHook>("other", noop, 50, "Other");
  const char* expected =
      "update hooks with exclusive key 'MixedPrecisionHook' must appear at most once in an "
      "orchestrator, got 2: 'mp1' and 'mp2'";
  try {
    auto o = mp1 + other + mp2;
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_STREQ(err.what(), expected);
  }
  // Also when the second arrives through the strategy's folding.
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {mp1, other});
  try {
    strategy.register_update_hook(mp2);
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_STREQ(err.what(), expected);
  }
  ASSERT_EQ(strategy.hooks().size(), 1u);
  EXPECT_EQ(names(*strategy.update_orchestrator()), (std::vector<std::string>{"mp1", "other"}));
}

TEST(UpdateHooks, LaterHooksSeeWillSkipAfterAVeto) {
  std::vector<Call> log;
  at::Tensor p = at::ones({2}, at::kDouble).requires_grad_(true);
  p.mutable_grad() = at::full({2}, 3.0, at::kDouble);
  torch::optim::SGD sgd(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(0.1));
  TrainingUpdateOrchestrator o(
      {logging("first", 5, &log),
       logging("vetoer", 10, &log, {TrainingStage::BEFORE_BATCH, TrainingStage::DO_OPTIMIZER_STEP}),
       logging("later", 20, &log), logging("last", 50, &log)});
  TrainContext ctx;
  ctx.optimizers = {&sgd};
  o(ctx, TrainingStage::BEFORE_BATCH);
  o(ctx, TrainingStage::DO_OPTIMIZER_STEP);
  o(ctx, TrainingStage::AFTER_OPTIMIZER_STEP);
  const std::vector<std::string> gated = {"first:0", "vetoer:0", "later:1", "last:1"};
  EXPECT_EQ(calls_at(log, TrainingStage::BEFORE_BATCH), gated);
  EXPECT_EQ(calls_at(log, TrainingStage::DO_OPTIMIZER_STEP), gated);
  EXPECT_EQ(calls_at(log, TrainingStage::AFTER_OPTIMIZER_STEP),
            (std::vector<std::string>{"first:1", "vetoer:1", "later:1", "last:1"}));
  // Neither zero_grad nor step ran.
  EXPECT_TRUE(at::equal(p.grad(), at::full({2}, 3.0, at::kDouble)));
  EXPECT_TRUE(at::equal(p.detach(), at::ones({2}, at::kDouble)));
  EXPECT_TRUE(o.optimizer_step_skipped());
  EXPECT_TRUE(ctx.optimizer_step_skipped);

  // Without a veto everything proceeds and will_skip stays false.
  std::vector<Call> log2;
  TrainingUpdateOrchestrator ok({logging("x", 10, &log2), logging("y", 20, &log2)});
  ctx.optimizer_step_skipped = false;
  ok(ctx, TrainingStage::DO_OPTIMIZER_STEP);
  ok(ctx, TrainingStage::AFTER_OPTIMIZER_STEP);
  EXPECT_EQ(calls_at(log2, TrainingStage::AFTER_OPTIMIZER_STEP),
            (std::vector<std::string>{"x:0", "y:0"}));
  EXPECT_FALSE(ok.optimizer_step_skipped());
  EXPECT_FALSE(ctx.optimizer_step_skipped);
  EXPECT_TRUE(at::allclose(p.detach(), at::full({2}, 0.7, at::kDouble)));  // 1 - 0.1 * 3
}

TEST(UpdateHooks, HalfThenDoubleLeavesLossAndGradientUnchanged) {
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  const Batch batch = loader.batch(0);
  std::vector<double> seen_by_double;
  auto half = std::make_shared<LambdaUpdateHook>(
      "half",
      [](TrainContext& ctx, TrainingStage s, bool) {
        return UpdateDecision{true, s == TrainingStage::DO_BACKWARD ? ctx.loss * 0.5 : ctx.loss};
      },
      10);
  auto twice = std::make_shared<LambdaUpdateHook>(
      "double",
      [&](TrainContext& ctx, TrainingStage s, bool) {
        if (s != TrainingStage::DO_BACKWARD) return UpdateDecision{true, ctx.loss};
        seen_by_double.push_back(ctx.loss.item<double>());
        return UpdateDecision{true, ctx.loss * 2.0};
      },
      20);
  std::vector<double> original_loss;
  auto probe = [&](std::vector<double>* g, ToyModel* m) {
    return std::make_shared<LambdaHook>(
        "probe",
        std::set<TrainingStage>{TrainingStage::BEFORE_BACKWARD, TrainingStage::AFTER_BACKWARD},
        [g, m, &original_loss](TrainContext& ctx, TrainingStage s) {
          if (s == TrainingStage::BEFORE_BACKWARD)
            original_loss.push_back(ctx.loss.item<double>());
          else
            *g = grads(*m);
        });
  };
  ToyModel with_hooks, plain;
  std::vector<double> g_hooks, g_plain;
  TrainingStrategy s1(with_hooks.ptr(), steps_options(1), energy_forces_loss(),
                      {twice, half, probe(&g_hooks, &with_hooks)});
  TrainingStrategy s2(plain.ptr(), steps_options(1), energy_forces_loss(),
                      {probe(&g_plain, &plain)});
  s1.train_batch(batch);
  s2.train_batch(batch);
  ASSERT_EQ(original_loss.size(), 2u);
  ASSERT_EQ(seen_by_double.size(), 1u);
  EXPECT_DOUBLE_EQ(seen_by_double[0], 0.5 * original_loss[0]);  // threaded through "half"
  ASSERT_EQ(g_hooks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(g_hooks[i], g_plain[i]) << "param " << i;
  EXPECT_EQ(params(with_hooks), params(plain));  // both stepped identically
  EXPECT_EQ(s1.step_count, 1);
}

TEST(UpdateHooks, BeforeBatchVetoSkipsZeroGradSoGradientsAccumulate) {
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  const Batch batch = loader.batch(0);
  // Veto both zero_grad and the step, so the parameters (and each batch's
  // gradient) stay the same: two batches accumulate twice one gradient.
  const std::set<TrainingStage> veto_all = {TrainingStage::BEFORE_BATCH,
                                            TrainingStage::DO_OPTIMIZER_STEP};
  const std::set<TrainingStage> veto_step = {TrainingStage::DO_OPTIMIZER_STEP};
  ToyModel acc, once;
  TrainingStrategy s_acc(acc.ptr(), steps_options(1), energy_forces_loss(),
                         {logging("no_zero", 10, nullptr, veto_all)});
  TrainingStrategy s_once(once.ptr(), steps_options(1), energy_forces_loss(),
                          {logging("zero", 10, nullptr, veto_step)});
  s_acc.train_batch(batch);
  s_acc.train_batch(batch);
  s_once.train_batch(batch);
  s_once.train_batch(batch);  // zero_grad ran: still one gradient
  const auto g2 = grads(acc);
  const auto g1 = grads(once);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(g2[i], 2.0 * g1[i], 1e-12 * std::max(1.0, std::abs(g1[i]))) << "param " << i;
  }
}

TEST(UpdateHooks, OptimizerStepVetoKeepsParametersAndStepCount) {
  std::vector<Call> log;
  ToyModel model;
  auto vetoer =
      logging("vetoer", update_priority::kSpikeSkipping, &log, {TrainingStage::DO_OPTIMIZER_STEP});
  auto observer = logging("observer", update_priority::kDefault, &log);
  bool plain_saw_skipped = false;
  auto after = std::make_shared<LambdaHook>(
      "after", std::set<TrainingStage>{TrainingStage::AFTER_OPTIMIZER_STEP},
      [&](TrainContext& ctx, TrainingStage) { plain_saw_skipped = ctx.optimizer_step_skipped; });
  TrainingStrategy strategy(model.ptr(), steps_options(1), energy_forces_loss(),
                            {vetoer, observer, after});
  const auto before = params(model);
  DataLoader loader(toy_dataset(4), {2, false, 0, false});
  strategy.train_batch(loader.batch(0));
  strategy.train_batch(loader.batch(1));
  EXPECT_EQ(params(model), before);
  EXPECT_EQ(strategy.step_count, 0);
  EXPECT_EQ(strategy.global_step_count, 0);
  EXPECT_EQ(strategy.batch_count, 2);
  EXPECT_TRUE(plain_saw_skipped);
  EXPECT_TRUE(strategy.update_orchestrator()->optimizer_step_skipped());
  EXPECT_EQ(calls_at(log, TrainingStage::AFTER_OPTIMIZER_STEP),
            (std::vector<std::string>{"vetoer:1", "observer:1", "vetoer:1", "observer:1"}));
}

TEST(UpdateHooks, AccumulationVetoStepsEveryOtherBatch) {
  // A gradient-accumulation hook (priority 10) keeps gradients and skips the
  // step on odd batches: 4 batches give 2 optimizer steps.
  auto accumulate = std::make_shared<LambdaUpdateHook>(
      "accumulate",
      [](TrainContext& ctx, TrainingStage s, bool) {
        const bool first_micro = ctx.batch_count % 2 == 0;
        bool proceed = true;
        if (s == TrainingStage::BEFORE_BATCH) proceed = first_micro;
        if (s == TrainingStage::DO_OPTIMIZER_STEP) proceed = !first_micro;
        return UpdateDecision{proceed, ctx.loss};
      },
      update_priority::kGradientAccumulation);
  DataLoader loader(toy_dataset(4), {1, false, 0, false});
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(2), energy_forces_loss(), {accumulate});
  strategy.run(loader);
  EXPECT_EQ(strategy.step_count, 2);
  EXPECT_EQ(strategy.batch_count, 4);
  EXPECT_EQ(strategy.epoch_count, 1);
}

TEST(UpdateHooks, UndefinedLossFromHookIsAnError) {
  auto broken =
      std::make_shared<LambdaUpdateHook>("broken", [](TrainContext& ctx, TrainingStage s, bool) {
        return UpdateDecision{true, s == TrainingStage::DO_BACKWARD ? at::Tensor() : ctx.loss};
      });
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {broken});
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  try {
    strategy.train_batch(loader.batch(0));
    FAIL();
  } catch (const std::logic_error& err) {
    EXPECT_STREQ(err.what(),
                 "update hook 'broken' must return a defined loss at DO_BACKWARD, got an "
                 "undefined tensor");
  }
  // Undefined losses elsewhere are fine (ignored).
  auto fine =
      std::make_shared<LambdaUpdateHook>("fine", [](TrainContext& ctx, TrainingStage s, bool) {
        return UpdateDecision{true, s == TrainingStage::DO_BACKWARD ? ctx.loss : at::Tensor()};
      });
  TrainingStrategy ok(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {fine});
  ok.train_batch(loader.batch(0));
  EXPECT_EQ(ok.step_count, 1);
}

TEST(UpdateHooks, CallingAnUpdateHookDirectlyIsAnError) {
  auto h = logging("bare", 50);
  TrainContext ctx;
  Hook& as_hook = *h;
  EXPECT_THROW(as_hook(ctx, TrainingStage::BEFORE_BATCH), std::logic_error);
  EXPECT_TRUE(h->runs_on_stage(TrainingStage::SETUP));
  EXPECT_TRUE(h->runs_on_stage(TrainingStage::DO_BACKWARD));
  EXPECT_FALSE(h->runs_on_stage(TrainingStage::AFTER_BATCH));
}

TEST(UpdateHooks, StepOwnerReplacesThePlainStep) {
  // The extension point for a gradient scaler: the owner steps the
  // optimizers itself and reports skipped steps.
  class Owner : public TrainingUpdateHook {
   public:
    std::string name() const override { return "owner"; }
    int priority() const override { return update_priority::kMixedPrecision; }
    bool owns_optimizer_step() const override { return true; }
    OptimizerStepReport step_optimizers(TrainContext& ctx) override {
      ++calls;
      OptimizerStepReport r;
      for (auto* opt : ctx.optimizers) {
        if (!skip) opt->step();
        r.skipped.push_back(skip);
      }
      return r;
    }
    bool skip = true;
    int calls = 0;
  };
  auto owner = std::make_shared<Owner>();
  ToyModel model;
  TrainingStrategy strategy(model.ptr(), steps_options(1), energy_forces_loss(), {owner});
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  const auto before = params(model);
  strategy.train_batch(loader.batch(0));
  EXPECT_EQ(owner->calls, 1);
  EXPECT_EQ(strategy.step_count, 0);
  EXPECT_EQ(params(model), before);
  owner->skip = false;
  strategy.train_batch(loader.batch(0));
  EXPECT_EQ(owner->calls, 2);
  EXPECT_EQ(strategy.step_count, 1);
  EXPECT_NE(params(model), before);
  // Two owners in one orchestrator are rejected.
  EXPECT_THROW(owner + std::make_shared<Owner>(), ConfigError);
}

TEST(UpdateHooks, EnterAndExitFanOutToChildren) {
  std::vector<Call> log;
  auto o = logging("a", 10, &log) + logging("b", 20, &log);
  o->enter();
  o->exit(false);
  std::vector<std::string> seen;
  for (const auto& c : log) seen.push_back(c.hook);
  EXPECT_EQ(seen, (std::vector<std::string>{"enter a", "enter b", "exit b", "exit a"}));
}

// ------------------------------------------------------------------ strategy

TEST(UpdateHooks, StrategyFoldsBareUpdateHooksIntoOneOrchestrator) {
  auto noop = [](TrainContext&, TrainingStage) {};
  auto p1 =
      std::make_shared<LambdaHook>("p1", std::set<TrainingStage>{TrainingStage::AFTER_BATCH}, noop);
  auto p2 =
      std::make_shared<LambdaHook>("p2", std::set<TrainingStage>{TrainingStage::AFTER_BATCH}, noop);
  auto u1 = logging("u1", 30);
  auto u2 = logging("u2", 10);
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {p1});
  strategy.register_hook(u1);
  strategy.register_hook(p2);
  strategy.register_update_hook(u2);
  EXPECT_EQ(names(strategy.hooks()),
            (std::vector<std::string>{"p1", "TrainingUpdateOrchestrator", "p2"}));
  auto orch = strategy.update_orchestrator();
  ASSERT_TRUE(orch);
  EXPECT_EQ(names(*orch), (std::vector<std::string>{"u2", "u1"}));
  EXPECT_EQ(names(strategy.registered_hooks()),
            (std::vector<std::string>{"p1", "TrainingUpdateOrchestrator", "u2", "u1", "p2"}));
  // Same result when the list is given to the constructor.
  TrainingStrategy at_once(ToyModel().ptr(), steps_options(1), energy_forces_loss(),
                           {p1, logging("v1", 30), p2, logging("v2", 10)});
  EXPECT_EQ(names(at_once.hooks()),
            (std::vector<std::string>{"p1", "TrainingUpdateOrchestrator", "p2"}));
  EXPECT_EQ(names(*at_once.update_orchestrator()), (std::vector<std::string>{"v2", "v1"}));
  // A registered update hook may not be registered again, also not bare.
  try {
    strategy.register_hook(u1);
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_STREQ(err.what(),
                 "hooks must not contain duplicate hook instances, got 'u1' twice; pass distinct "
                 "hook objects instead");
  }
  // A second explicit orchestrator is rejected.
  try {
    strategy.register_hook(logging("w1", 10) + logging("w2", 20));
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_STREQ(err.what(),
                 "hooks must contain at most one TrainingUpdateOrchestrator, got 2; compose "
                 "update hooks with + before registration");
  }
  EXPECT_EQ(strategy.update_orchestrator(), orch);  // unchanged after the rejections
  // A single explicit orchestrator is registered as is.
  auto explicit_orch = logging("e1", 10) + logging("e2", 20);
  TrainingStrategy with_explicit(ToyModel().ptr(), steps_options(1), energy_forces_loss(),
                                 {explicit_orch});
  EXPECT_EQ(with_explicit.update_orchestrator(), explicit_orch);
}

TEST(UpdateHooks, StrategyRejectsDoBackwardLambdaHookAlongsideOrchestrator) {
  auto noop = [](TrainContext&, TrainingStage) {};
  auto do_backward = std::make_shared<LambdaHook>(
      "owner", std::set<TrainingStage>{TrainingStage::DO_BACKWARD}, noop);
  const char* expected =
      "at most one hook may claim DO_BACKWARD, got 2: TrainingUpdateOrchestrator, owner; if a "
      "plain DO-stage hook should compose with update policies, implement it as a "
      "TrainingUpdateHook so it runs inside the TrainingUpdateOrchestrator";
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(),
                            {logging("u", 50)});
  try {
    strategy.register_hook(do_backward);
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_STREQ(err.what(), expected);
  }
  EXPECT_EQ(strategy.hooks().size(), 1u);
  // The other way round: the plain owner first, then an update hook.
  TrainingStrategy other(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {do_backward});
  try {
    other.register_update_hook(logging("u", 50));
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_STREQ(err.what(),
                 "at most one hook may claim DO_BACKWARD, got 2: owner, "
                 "TrainingUpdateOrchestrator; if a plain DO-stage hook should compose with update "
                 "policies, implement it as a TrainingUpdateHook so it runs inside the "
                 "TrainingUpdateOrchestrator");
  }
  EXPECT_EQ(names(other.hooks()), (std::vector<std::string>{"owner"}));
}

TEST(UpdateHooks, StrategyOrdersOrchestratorBeforeDependentHookRegisteredEarlier) {
  std::vector<Call> log;
  auto dependent = std::make_shared<DependentHook>(&log);
  auto noop = [](TrainContext&, TrainingStage) {};
  auto first = std::make_shared<LambdaHook>(
      "first", std::set<TrainingStage>{TrainingStage::AFTER_BATCH}, noop);
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(),
                            {first, dependent});
  strategy.register_hook(logging("update", 50, &log));
  EXPECT_EQ(names(strategy.hooks()),
            (std::vector<std::string>{"first", "TrainingUpdateOrchestrator", "dependent"}));
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  strategy.train_batch(loader.batch(0));
  EXPECT_EQ(calls_at(log, TrainingStage::AFTER_OPTIMIZER_STEP),
            (std::vector<std::string>{"update:0", "dependent:0"}));
}

TEST(UpdateHooks, ValidateRegisteredHooksSeesOrchestratorChildren) {
  // A plain hook that requires an update hook named "needed" somewhere in
  // the registered set, and an update hook that validates too.
  class Needs : public Hook {
   public:
    std::string name() const override { return "needs"; }
    bool runs_on_stage(TrainingStage) const override { return false; }
    void operator()(TrainContext&, TrainingStage) override {}
    void validate_registered_hooks(const std::vector<std::shared_ptr<Hook>>& hooks) const override {
      for (const auto& h : hooks) {
        if (h->name() == "needed") return;
      }
      throw ConfigError("hooks must contain an update hook 'needed', got none");
    }
  };
  class CountingUpdate : public TrainingUpdateHook {
   public:
    std::string name() const override { return "needed"; }
    void validate_registered_hooks(const std::vector<std::shared_ptr<Hook>>& hooks) const override {
      seen = hooks.size();
    }
    mutable size_t seen = 0;
  };
  auto needs = std::make_shared<Needs>();
  EXPECT_THROW(TrainingStrategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {needs}),
               ConfigError);
  auto needed = std::make_shared<CountingUpdate>();
  TrainingStrategy ok(ToyModel().ptr(), steps_options(1), energy_forces_loss(),
                      {needs, needed, logging("x", 10)});
  EXPECT_EQ(needed->seen, 4u);  // needs, orchestrator, x, needed
}

TEST(UpdateHooks, SetupReachesEveryChild) {
  std::vector<Call> log;
  auto a = logging("a", 20, &log);
  auto b = logging("b", 10, &log);
  DataLoader loader(toy_dataset(2), {2, false, 0, false});
  TrainingStrategy strategy(ToyModel().ptr(), steps_options(1), energy_forces_loss(), {a, b});
  strategy.run(loader);
  EXPECT_EQ(calls_at(log, TrainingStage::SETUP), (std::vector<std::string>{"b:0", "a:0"}));
  EXPECT_EQ(calls_at(log, TrainingStage::BEFORE_BATCH), (std::vector<std::string>{"b:0", "a:0"}));
  EXPECT_EQ(calls_at(log, TrainingStage::DO_BACKWARD), (std::vector<std::string>{"b:0", "a:0"}));
  // Children see only SETUP and the update stages.
  for (const auto& c : log) {
    if (c.hook.rfind("enter ", 0) == 0 || c.hook.rfind("exit ", 0) == 0) continue;
    EXPECT_TRUE(c.stage == TrainingStage::SETUP || is_training_update_stage(c.stage))
        << stage_name(c.stage);
  }
  // enter/exit reached the children through the strategy.
  EXPECT_EQ(log.front().hook, "enter b");
  EXPECT_EQ(log.back().hook, "exit b");
  EXPECT_EQ(strategy.step_count, 1);
}

TEST(TrainableParameters, EveryModelsParametersThatRequireGradEachOnce) {
  ToyModel main_model, other;
  other->c.requires_grad_(false);  // frozen: not a backward target
  TrainContext ctx;
  ctx.model = main_model.get();
  ctx.models = {{"main", main_model.get()}, {"other", other.get()}, {"alias", main_model.get()}};
  const std::vector<at::Tensor> params = trainable_parameters(ctx);
  ASSERT_EQ(params.size(), 5u);  // main a, b, c once (listed twice); other a, b
  std::vector<const void*> expected{main_model->a.unsafeGetTensorImpl(), main_model->b.unsafeGetTensorImpl(),
                                    main_model->c.unsafeGetTensorImpl(), other->a.unsafeGetTensorImpl(),
                                    other->b.unsafeGetTensorImpl()};
  std::vector<const void*> got;
  for (const auto& p : params) got.push_back(p.unsafeGetTensorImpl());
  EXPECT_EQ(got, expected);  // "alias" < "main" < "other": main's first
}

}  // namespace
}  // namespace crucible
