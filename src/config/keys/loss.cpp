// Recipe keys, training.loss.* (crucible/losses/loss.h, loss_weight_schedule.h).

#include "../schema.h"

#include "crucible/models/registry.h"

#include <string>
#include <variant>
#include <vector>

namespace crucible::config_schema {

void add_loss_keys(KeyTable& t) {
  min_incl(t.add("training.loss.energy_weight", Kind::kFloat, "",
               "Weight of the energy term (0 = off). With mse the term is in eV²/atom² "
               "with energy_per_atom, else eV².",
               [](Config& c) -> void* { return &c.training.loss.energy_weight; }),
           0.0);
  min_incl(t.add("training.loss.forces_weight", Kind::kFloat, "",
               "Weight of the forces term (mse: eV²/Å²; 0 = off).",
               [](Config& c) -> void* { return &c.training.loss.forces_weight; }),
           0.0);
  min_incl(t.add("training.loss.stress_weight", Kind::kFloat, "",
               "Weight of the stress term (mse: (eV/Å³)²; 0 = off). Used only when the "
               "training data has stresses (or virials).",
               [](Config& c) -> void* { return &c.training.loss.stress_weight; }),
           0.0);
  t.add("training.loss.energy_per_atom", Kind::kBool, "",
      "Compare energies per atom, (E_pred - E_ref)/N, in the energy term.",
      [](Config& c) -> void* { return &c.training.loss.energy_per_atom; });
  t.add("training.loss.kind", Kind::kString, "",
      "Penalty of every term: mse, mae, or huber (PyTorch huber_loss with huber_delta).",
      [](Config& c) -> void* { return &c.training.loss.kind; })
      .choices = {"mse", "mae", "huber"};
  min_excl(t.add("training.loss.huber_delta", Kind::kFloat, "",
               "huber: error size where the penalty turns from quadratic to linear, in the "
               "unit of each term (eV/atom or eV, eV/Å, eV/Å³). Used only with kind huber.",
               [](Config& c) -> void* { return &c.training.loss.huber_delta; }),
           0.0);
  t.add("training.loss.forces_mode", Kind::kString, "",
      "Forces term over every Cartesian component, or over each atom's error-vector norm "
      "|F_pred - F_ref| (vector).",
      [](Config& c) -> void* { return &c.training.loss.forces_mode; })
      .choices = {"component", "vector"};
  t.add("training.loss.normalize_weights", Kind::kBool, "",
      "Divide the total loss by the sum of the weights.",
      [](Config& c) -> void* { return &c.training.loss.normalize_weights; });
  t.add("training.loss.config_type_weights", Kind::kWeightMap, "",
      "Weight of the structures of each config_type (extxyz info key) in every term, e.g. "
      "{bulk: 1.0, surface: 5.0} (MACE config_type_weights); types not listed weigh 1.",
      [](Config& c) -> void* { return &c.training.loss.config_type_weights; });
  t.add("training.loss.schedule", Kind::kString, "",
      "How the three weights change from *_weight to *_weight_final: constant (no change), "
      "linear or cosine from schedule_start to schedule_end, or step (jump at "
      "schedule_start, like MACE's SWA stage).",
      [](Config& c) -> void* { return &c.training.loss.schedule; })
      .choices = {"constant", "linear", "cosine", "step"};
  t.add("training.loss.schedule_clock", Kind::kString, "",
      "Counter the weight schedule follows: epoch or (optimizer) step.",
      [](Config& c) -> void* { return &c.training.loss.schedule_clock; })
      .choices = {"epoch", "step"};
  min_incl(t.add("training.loss.schedule_start", Kind::kInt, "",
               "First epoch/step of the weight change.",
               [](Config& c) -> void* { return &c.training.loss.schedule_start; }),
           0.0);
  min_incl(t.add("training.loss.schedule_end", Kind::kInt, "",
               "linear/cosine: epoch/step where the final weights are reached (>= "
               "schedule_start).",
               [](Config& c) -> void* { return &c.training.loss.schedule_end; }),
           0.0);
  min_incl(t.add("training.loss.energy_weight_final", Kind::kFloat, "",
               "Energy weight at the end of the schedule.",
               [](Config& c) -> void* { return &c.training.loss.energy_weight_final; }),
           0.0);
  min_incl(t.add("training.loss.forces_weight_final", Kind::kFloat, "",
               "Forces weight at the end of the schedule.",
               [](Config& c) -> void* { return &c.training.loss.forces_weight_final; }),
           0.0);
  min_incl(t.add("training.loss.stress_weight_final", Kind::kFloat, "",
               "Stress weight at the end of the schedule.",
               [](Config& c) -> void* { return &c.training.loss.stress_weight_final; }),
           0.0);
}

}  // namespace crucible::config_schema
