// Recipe keys, training.optimizer.* and training.scheduler.* (crucible/training/optimizers.h, lr_scheduler.h).

#include "../schema.h"

#include "crucible/models/registry.h"
#include "crucible/training/metrics.h"

#include <string>
#include <variant>
#include <vector>

namespace crucible::config_schema {

void add_optimizer_keys(KeyTable& t) {
  t.add("training.optimizer.name", Kind::kString, "",
      "Optimizer (PyTorch semantics): adam, adamw, sgd, rmsprop or adagrad. Options an "
      "optimizer does not have must keep their defaults.",
      [](Config& c) -> void* { return &c.training.optimizer.name; })
      .choices = {"adam", "adamw", "sgd", "rmsprop", "adagrad"};
  min_excl(t.add("training.optimizer.lr", Kind::kFloat, "", "Learning rate.",
               [](Config& c) -> void* { return &c.training.optimizer.lr; }),
           0.0);
  min_incl(t.add("training.optimizer.weight_decay", Kind::kFloat, "",
               "Weight decay: L2 penalty for adam, decoupled decay for adamw.",
               [](Config& c) -> void* { return &c.training.optimizer.weight_decay; }),
           0.0);
  {
    Key& key = t.add("training.optimizer.beta1", Kind::kFloat, "",
                   "Adam coefficient of the running mean of gradients, in [0, 1).",
                   [](Config& c) -> void* { return &c.training.optimizer.beta1; });
    key.min = 0.0;
    key.max = 1.0;
  }
  {
    Key& key = t.add("training.optimizer.beta2", Kind::kFloat, "",
                   "Adam coefficient of the running mean of squared gradients, in [0, 1).",
                   [](Config& c) -> void* { return &c.training.optimizer.beta2; });
    key.min = 0.0;
    key.max = 1.0;
  }
  min_excl(t.add("training.optimizer.eps", Kind::kFloat, "",
               "Adam denominator term for numerical stability.",
               [](Config& c) -> void* { return &c.training.optimizer.eps; }),
           0.0);
  t.add("training.optimizer.amsgrad", Kind::kBool, "", "Use the AMSGrad variant of Adam.",
      [](Config& c) -> void* { return &c.training.optimizer.amsgrad; });
  min_incl(t.add("training.optimizer.momentum", Kind::kFloat, "",
               "sgd / rmsprop: momentum factor.",
               [](Config& c) -> void* { return &c.training.optimizer.momentum; }),
           0.0);
  min_incl(t.add("training.optimizer.dampening", Kind::kFloat, "", "sgd: dampening of the momentum.",
               [](Config& c) -> void* { return &c.training.optimizer.dampening; }),
           0.0);
  t.add("training.optimizer.nesterov", Kind::kBool, "",
      "sgd: Nesterov momentum (needs momentum > 0 and dampening 0).",
      [](Config& c) -> void* { return &c.training.optimizer.nesterov; });
  {
    Key& key = t.add("training.optimizer.alpha", Kind::kFloat, "",
                   "rmsprop: smoothing constant of the squared-gradient average, in [0, 1).",
                   [](Config& c) -> void* { return &c.training.optimizer.alpha; });
    key.min = 0.0;
    key.max = 1.0;
  }
  t.add("training.optimizer.centered", Kind::kBool, "",
      "rmsprop: normalise by the centred second moment.",
      [](Config& c) -> void* { return &c.training.optimizer.centered; });
  min_incl(t.add("training.optimizer.lr_decay", Kind::kFloat, "", "adagrad: learning-rate decay.",
               [](Config& c) -> void* { return &c.training.optimizer.lr_decay; }),
           0.0);
  min_incl(t.add("training.optimizer.initial_accumulator_value", Kind::kFloat, "",
               "adagrad: initial value of the squared-gradient sums.",
               [](Config& c) -> void* {
                 return &c.training.optimizer.initial_accumulator_value;
               }),
           0.0);
  t.add("training.optimizer.no_weight_decay", Kind::kString, "",
      "Regular expression (searched in parameter names such as embedding.weight or "
      "out1.bias) of parameters put in a param group with weight_decay 0, e.g. "
      "\"embedding|bias\"; \"\" = none.",
      [](Config& c) -> void* { return &c.training.optimizer.no_weight_decay; });
  t.add("training.scheduler.name", Kind::kString, "",
      "Learning-rate schedule, stepped after every optimizer step that ran: constant, cosine "
      "(anneal from lr to lr * final_lr_factor at the last step, PyTorch/NequIP "
      "CosineAnnealingLR), step (StepLR: times gamma every step_size steps), exponential "
      "(ExponentialLR: times gamma every step), or plateau (ReduceLROnPlateau on the "
      "validation metric `monitor`, stepped after each validation). Options a schedule does "
      "not use must keep their defaults.",
      [](Config& c) -> void* { return &c.training.scheduler.name; })
      .choices = {"constant", "cosine", "step", "exponential", "plateau"};
  {
    Key& key = t.add("training.scheduler.final_lr_factor", Kind::kFloat, "",
                   "cosine: learning rate at the last step divided by training.optimizer.lr, "
                   "in [0, 1].",
                   [](Config& c) -> void* { return &c.training.scheduler.final_lr_factor; });
    key.min = 0.0;
    key.max = 1.0;
    key.max_inclusive = true;
  }
  min_incl(t.add("training.scheduler.step_size", Kind::kInt, "",
               "step: optimizer steps between two decays by gamma.",
               [](Config& c) -> void* { return &c.training.scheduler.step_size; }),
           1.0);
  {
    Key& key = t.add("training.scheduler.gamma", Kind::kFloat, "",
                   "step / exponential: multiplicative decay of the learning rate, in (0, 1].",
                   [](Config& c) -> void* { return &c.training.scheduler.gamma; });
    key.min = 0.0;
    key.min_exclusive = true;
    key.max = 1.0;
    key.max_inclusive = true;
  }
  min_incl(t.add("training.scheduler.warmup_steps", Kind::kInt, "",
               "Linear warmup over this many optimizer steps before the schedule starts "
               "(PyTorch SequentialLR of LinearLR and the schedule); 0 = none. Not with plateau.",
               [](Config& c) -> void* { return &c.training.scheduler.warmup_steps; }),
           0.0);
  {
    Key& key = t.add("training.scheduler.warmup_start_factor", Kind::kFloat, "",
                   "Learning rate at the first warmup step divided by training.optimizer.lr, "
                   "in [0, 1].",
                   [](Config& c) -> void* { return &c.training.scheduler.warmup_start_factor; });
    key.min = 0.0;
    key.max = 1.0;
    key.max_inclusive = true;
  }
  t.add("training.scheduler.monitor", Kind::kString, "",
      "plateau: validation monitor to minimise: loss (the weighted training loss on the "
      "validation set, MACE's) or a metric (energy_mae, energy_rmse, forces_mae, forces_rmse, "
      "stress_mae, stress_rmse); a val/ prefix is accepted.",
      [](Config& c) -> void* { return &c.training.scheduler.monitor; })
      .choices = validation_monitor_names();
  {
    Key& key = t.add("training.scheduler.factor", Kind::kFloat, "",
                   "plateau: learning-rate multiplier on a plateau, in (0, 1).",
                   [](Config& c) -> void* { return &c.training.scheduler.factor; });
    key.min = 0.0;
    key.min_exclusive = true;
    key.max = 1.0;
  }
  min_incl(t.add("training.scheduler.patience", Kind::kInt, "",
               "plateau: validations without improvement before the learning rate is reduced.",
               [](Config& c) -> void* { return &c.training.scheduler.patience; }),
           0.0);
  min_incl(t.add("training.scheduler.threshold", Kind::kFloat, "",
               "plateau: relative improvement of the metric that counts as one.",
               [](Config& c) -> void* { return &c.training.scheduler.threshold; }),
           0.0);
  min_incl(t.add("training.scheduler.cooldown", Kind::kInt, "",
               "plateau: validations to wait after a reduction before counting again.",
               [](Config& c) -> void* { return &c.training.scheduler.cooldown; }),
           0.0);
  min_incl(t.add("training.scheduler.min_lr", Kind::kFloat, "",
               "plateau: lower bound of the learning rate.",
               [](Config& c) -> void* { return &c.training.scheduler.min_lr; }),
           0.0);
}

}  // namespace crucible::config_schema
