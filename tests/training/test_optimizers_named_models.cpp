// Optimizer configs (issue 4 deliverable 1), named models and parameter
// filters (deliverables 2-3, seed 002): optimizers by name with their
// options, param groups by name pattern, several optimizers per model with a
// scheduler each, frozen teachers restored after the run (also when it
// throws), and the requires_grad filters.

#include "crucible/common/error.h"
#include "crucible/training/optimizers.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::ToyModel;
using testing::toy_dataset;

std::vector<std::pair<std::string, at::Tensor>> named(ToyModel& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : m->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

std::string config_error(const OptimizerConfig& c) {
  try {
    check_optimizer_config(c, "opt");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Optimizers, EveryNameBuildsWithPyTorchDefaultsAndItsOptions) {
  ToyModel m;
  {
    OptimizerConfig c;
    c.name = "adamw";
    auto opt = make_optimizer(c, named(m), "opt");
    auto& o = static_cast<torch::optim::AdamWOptions&>(opt->param_groups()[0].options());
    EXPECT_DOUBLE_EQ(o.lr(), 1e-3);
    EXPECT_DOUBLE_EQ(o.weight_decay(), 1e-2);  // AdamW's own default
  }
  {
    OptimizerConfig c;
    c.name = "sgd";
    c.lr = 0.1;
    c.momentum = 0.9;
    c.nesterov = true;
    auto opt = make_optimizer(c, named(m), "opt");
    auto& o = static_cast<torch::optim::SGDOptions&>(opt->param_groups()[0].options());
    EXPECT_DOUBLE_EQ(o.momentum(), 0.9);
    EXPECT_TRUE(o.nesterov());
  }
  {
    OptimizerConfig c;
    c.name = "rmsprop";
    c.centered = true;
    auto opt = make_optimizer(c, named(m), "opt");
    auto& o = static_cast<torch::optim::RMSpropOptions&>(opt->param_groups()[0].options());
    EXPECT_DOUBLE_EQ(o.lr(), 1e-2);
    EXPECT_DOUBLE_EQ(o.alpha(), 0.99);
    EXPECT_TRUE(o.centered());
  }
  {
    OptimizerConfig c;
    c.name = "adagrad";
    c.lr_decay = 0.5;
    auto opt = make_optimizer(c, named(m), "opt");
    auto& o = static_cast<torch::optim::AdagradOptions&>(opt->param_groups()[0].options());
    EXPECT_DOUBLE_EQ(o.eps(), 1e-10);
    EXPECT_DOUBLE_EQ(o.lr_decay(), 0.5);
  }
}

TEST(Optimizers, ParamGroupsByNamePatternFirstMatchWins) {
  ToyModel m;  // parameters a, b, c
  OptimizerConfig c;
  c.name = "adam";
  c.weight_decay = 0.1;
  c.param_groups = {ParamGroupConfig{"^a$", {{"weight_decay", 0.0}}},
                    ParamGroupConfig{"^[ab]$", {{"lr", 0.5}}}};
  auto opt = make_optimizer(c, named(m), "opt");
  ASSERT_EQ(opt->param_groups().size(), 3u);
  auto wd = [&](size_t g) {
    return static_cast<torch::optim::AdamOptions&>(opt->param_groups()[g].options()).weight_decay();
  };
  auto lr = [&](size_t g) { return opt->param_groups()[g].options().get_lr(); };
  EXPECT_TRUE(opt->param_groups()[0].params()[0].is_same(m->a));
  EXPECT_EQ(wd(0), 0.0);
  EXPECT_EQ(lr(0), 1e-3);
  ASSERT_EQ(opt->param_groups()[1].params().size(), 1u);  // b only: a went to group 0
  EXPECT_TRUE(opt->param_groups()[1].params()[0].is_same(m->b));
  EXPECT_EQ(lr(1), 0.5);
  EXPECT_EQ(wd(1), 0.1);
  EXPECT_TRUE(opt->param_groups()[2].params()[0].is_same(m->c));  // the default group

  c.param_groups = {ParamGroupConfig{"embedding", {{"weight_decay", 0.0}}}};
  try {
    make_optimizer(c, named(m), "opt");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "opt.param_groups[0].pattern 'embedding' must match at least one "
                           "parameter, got none (check the parameter names)");
  }
}

TEST(Optimizers, MisspelledOrForeignOptionsAreErrorsNamingTheOption) {
  OptimizerConfig c;
  c.name = "adam";
  c.momentum = 0.9;
  EXPECT_EQ(config_error(c), "opt.momentum is not an option of adam (its options: lr, "
                             "weight_decay, eps, beta1, beta2, amsgrad)");
  c = OptimizerConfig{};
  c.param_groups = {ParamGroupConfig{"a", {{"weight_decya", 0.0}}}};
  EXPECT_EQ(config_error(c), "opt.param_groups[0].weight_decya is not an option of adam (its "
                             "options: lr, weight_decay, eps, beta1, beta2, amsgrad)");
  c = OptimizerConfig{};
  c.name = "sgd";
  EXPECT_EQ(config_error(c), "opt.lr must be set for sgd (PyTorch's SGD has no default lr), got "
                             "none");
  c.lr = 0.1;
  c.nesterov = true;
  EXPECT_EQ(config_error(c), "opt.nesterov needs momentum > 0 and dampening 0, got momentum 0 and "
                             "dampening 0");
  c = OptimizerConfig{};
  c.beta2 = 1.0;
  EXPECT_EQ(config_error(c), "opt.beta2 must be in [0, 1), got 1");
  c = OptimizerConfig{};
  c.params = "(";
  EXPECT_NE(config_error(c).find("opt.params must be a valid regular expression, got '('"),
            std::string::npos);
  c = OptimizerConfig{};
  c.name = "lbfgs";
  EXPECT_EQ(config_error(c),
            "opt.name must be one of adam, adamw, sgd, rmsprop, adagrad, got 'lbfgs'");
}

StrategyOptions default_lr_options(int64_t steps) {
  StrategyOptions o;
  o.num_steps = steps;
  o.dtype = at::kDouble;
  return o;
}

TEST(NamedModels, SeveralOptimizersPerModelEachWithItsScheduler) {
  ToyModel m;
  StrategyOptions o = default_lr_options(3);
  OptimizerConfig first;  // a and b
  first.name = "sgd";
  first.lr = 0.01;
  first.params = "^[ab]$";
  SchedulerConfig halve;
  halve.name = "exponential";
  halve.gamma = 0.5;
  first.scheduler = halve;
  OptimizerConfig rest;  // everything not taken: c
  rest.name = "adam";
  rest.lr = 0.002;
  o.optimizer_configs["main"] = {first, rest};
  TrainingStrategy s(m.ptr(), o, energy_forces_loss());
  DataLoader loader(toy_dataset(6), {2, false, 0, false});
  s.run(loader);
  const auto opts = s.optimizers();
  ASSERT_EQ(opts.size(), 2u);
  ASSERT_EQ(opts[0]->param_groups()[0].params().size(), 2u);
  ASSERT_EQ(opts[1]->param_groups()[0].params().size(), 1u);
  EXPECT_TRUE(opts[1]->param_groups()[0].params()[0].is_same(m->c));
  EXPECT_DOUBLE_EQ(opts[0]->param_groups()[0].options().get_lr(), 0.01 * 0.125);
  EXPECT_DOUBLE_EQ(opts[1]->param_groups()[0].options().get_lr(), 0.002);
  const auto scheds = s.lr_schedulers();
  ASSERT_EQ(scheds.size(), 2u);
  EXPECT_EQ(scheds[0]->last_step(), 3);
  EXPECT_EQ(scheds[1], nullptr);
}

/// A student trained on energies of a frozen teacher (the README example's shape).
struct Distillation {
  ToyModel student{1.0, 1.0, 0.0};
  ToyModel teacher{2.0, 1.5, -0.3};
  std::vector<bool> teacher_flags_before;
  StrategyOptions options() {
    StrategyOptions o;
    o.num_epochs = 2;
    o.dtype = at::kDouble;
    OptimizerConfig c;
    c.lr = 0.05;
    o.optimizer_configs["student"] = {c};
    return o;
  }
  NamedTrainingFn fn(int throw_at_call = -1) {
    auto calls = std::make_shared<int>(0);
    return [calls, throw_at_call](const std::map<std::string, EnergyModel*>& models,
                                  const Batch& b) {
      if ((*calls)++ == throw_at_call) throw std::runtime_error("boom");
      EnergyModel* t = models.at("teacher");
      EXPECT_FALSE(t->module().is_training());  // frozen: eval mode
      for (const auto& p : t->module().parameters()) EXPECT_FALSE(p.requires_grad());
      ComputeOptions co;
      co.training = true;
      ModelOutputs out = compute_outputs(*models.at("student"), b, co);
      // The teacher takes part in the graph (× 0): only its frozen flags keep
      // gradients away from it.
      out.energy = out.energy + 0.0 * t->energy(b);
      return out;
    };
  }
};

TEST(NamedModels, FrozenTeacherGetsNoGradientAndIsRestoredAfterTheRunAndAfterAThrow) {
  for (bool fail : {false, true}) {
    Distillation d;
    d.teacher->train(true);  // the user's mode, to be restored
    d.teacher->b.requires_grad_(false);  // a user-set flag, to be restored as is
    const at::Tensor teacher_a = d.teacher->a.detach().clone();
    TrainingStrategy s({{"student", d.student.ptr()}, {"teacher", d.teacher.ptr()}}, d.options(),
                       energy_forces_loss(), {}, d.fn(fail ? 3 : -1));
    EXPECT_EQ(&s.model(), d.student.get());  // the primary model: the configured one
    DataLoader loader(toy_dataset(8), {2, false, 0, false});
    if (fail) {
      EXPECT_THROW(s.run(loader), std::runtime_error);
    } else {
      s.run(loader);
      EXPECT_EQ(s.step_count, 8);
      EXPECT_FALSE(d.student->a.detach().equal(at::full({}, 1.0, at::kDouble)));
    }
    EXPECT_TRUE(d.teacher->is_training());
    EXPECT_TRUE(d.teacher->a.requires_grad());
    EXPECT_FALSE(d.teacher->b.requires_grad());
    EXPECT_TRUE(d.teacher->c.requires_grad());
    EXPECT_FALSE(d.teacher->a.grad().defined());
    EXPECT_TRUE(d.teacher->a.detach().equal(teacher_a));
    ASSERT_EQ(s.optimizers().size(), 1u);
  }
}

TEST(NamedModels, ConfigKeysMustNameModels) {
  ToyModel a, b;
  StrategyOptions o = default_lr_options(1);
  o.optimizer_configs["studnet"] = {OptimizerConfig{}};
  try {
    TrainingStrategy s({{"student", a.ptr()}, {"teacher", b.ptr()}}, o, energy_forces_loss());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "optimizer_configs key 'studnet' must name a model (student, teacher), "
                           "got no such model");
  }
  o.optimizer_configs.clear();  // no "main" and no configs
  EXPECT_THROW(TrainingStrategy({{"student", a.ptr()}}, o, energy_forces_loss()), ConfigError);
  o.optimizer_configs["student"] = {};
  EXPECT_THROW(TrainingStrategy({{"student", a.ptr()}}, o, energy_forces_loss()), ConfigError);
}

TEST(ParameterFilters, TrainableForceTrainableAndOptimizerFiltersAreUndoneAfterTheRun) {
  ToyModel m;
  m->c.requires_grad_(false);
  StrategyOptions o = default_lr_options(2);
  o.optimizer.lr = 0.05;
  TrainingStrategy s(m.ptr(), o, energy_forces_loss());
  s.set_trainable_parameter_filter(std::set<std::string>{"main.a", "main.b"});
  s.set_force_trainable_parameter_filter(std::set<std::string>{"main.c"});
  s.set_optimizer_parameter_filter(std::set<std::string>{"main.a", "main.c"});
  bool checked = false;
  s.register_hook(std::make_shared<LambdaHook>(
      "flags", std::set<TrainingStage>{TrainingStage::BEFORE_FORWARD},
      [&](TrainContext&, TrainingStage) {
        EXPECT_TRUE(m->a.requires_grad());
        EXPECT_TRUE(m->b.requires_grad());
        EXPECT_TRUE(m->c.requires_grad());  // forced
        checked = true;
      }));
  const at::Tensor b0 = m->b.detach().clone();
  const at::Tensor a0 = m->a.detach().clone();
  DataLoader loader(toy_dataset(4), {2, false, 0, false});
  s.run(loader);
  EXPECT_TRUE(checked);
  ASSERT_EQ(s.optimizers().size(), 1u);
  EXPECT_EQ(s.optimizers()[0]->param_groups()[0].params().size(), 2u);  // a and c
  EXPECT_TRUE(m->b.detach().equal(b0));    // trainable but not given to the optimizer
  EXPECT_FALSE(m->a.detach().equal(a0));   // optimized
  EXPECT_FALSE(m->c.requires_grad());      // the original flag is back
  EXPECT_TRUE(m->a.requires_grad());

  // The trainable filter alone: parameters outside it do not move.
  ToyModel m2;
  TrainingStrategy s2(m2.ptr(), o, energy_forces_loss());
  s2.set_trainable_parameter_filter(std::set<std::string>{"main.a"});
  const at::Tensor c0 = m2->c.detach().clone();
  DataLoader loader2(toy_dataset(4), {2, false, 0, false});
  s2.run(loader2);
  EXPECT_TRUE(m2->c.detach().equal(c0));
  EXPECT_TRUE(m2->c.requires_grad());
  EXPECT_EQ(s2.optimizers()[0]->param_groups()[0].params().size(), 1u);
}

}  // namespace
}  // namespace crucible
