// Recipe keys, training.*: the loop's length and seed, the validation cadence, dtype, precision, device and threads (TrainingStrategy, crucible/training/strategy.h).

#include "../schema.h"

#include "crucible/models/registry.h"

#include <string>
#include <variant>
#include <vector>

namespace crucible::config_schema {

void add_training_loop_keys(KeyTable& t) {
  // training
  min_incl(t.add("training.num_epochs", Kind::kOptInt, "",
               "Number of passes over the training set. Exactly one of num_epochs and "
               "num_steps is set; setting one unsets the other.",
               [](Config& c) -> void* { return &c.training.num_epochs; }),
           1.0);
  min_incl(t.add("training.num_steps", Kind::kOptInt, "",
               "Number of optimizer steps (alternative to num_epochs).",
               [](Config& c) -> void* { return &c.training.num_steps; }),
           1.0);
  min_incl(t.add("training.batch_size", Kind::kInt, "",
               "Structures per training batch (one optimizer step per batch).",
               [](Config& c) -> void* { return &c.training.batch_size; }),
           1.0);
  min_incl(t.add("training.valid_batch_size", Kind::kInt, "",
               "Structures per validation batch (memory only; metrics do not depend on it).",
               [](Config& c) -> void* { return &c.training.valid_batch_size; }),
           1.0);
  min_incl(t.add("training.seed", Kind::kInt, "",
               "Seed of the parameter initialization (torch manual seed) and of the batch "
               "shuffling.",
               [](Config& c) -> void* { return &c.training.seed; }),
           0.0);
}

void add_training_run_keys(KeyTable& t) {
  min_incl(t.add("training.validate_every_n_epochs", Kind::kInt, "",
               "Validate after every n-th epoch; 0 = only once, after training. Not used "
               "when training.validate_every_n_steps > 0 (the step cadence takes precedence, "
               "as in the reference design).",
               [](Config& c) -> void* { return &c.training.validate_every_n_epochs; }),
           0.0);
  min_incl(t.add("training.validate_every_n_steps", Kind::kInt, "",
               "Validate every n-th optimizer step (not on a step a hook skipped) instead of "
               "every n epochs; 0 = off (the epoch cadence applies).",
               [](Config& c) -> void* { return &c.training.validate_every_n_steps; }),
           0.0);
  t.add("training.validate_with_mixed_precision", Kind::kString, "",
      "Validation under the training precision's autocast: auto (when training.precision is "
      "a mixed mode), always (an error without one), never (the model's dtype).",
      [](Config& c) -> void* { return &c.training.validate_with_mixed_precision; })
      .choices = {"auto", "always", "never"};
  t.add("training.dtype", Kind::kString, "",
      "Floating-point precision of the model and batches: float32 or float64.",
      [](Config& c) -> void* { return &c.training.dtype; })
      .choices = {"float32", "float64"};
  t.add("training.precision", Kind::kOptString, "",
      "Precision mode: 64-true, 32-true, bf16-mixed (bfloat16 autocast) or 16-mixed (float16 "
      "autocast where supported + gradient scaler); overrides training.dtype. Forces, stress, "
      "energies and losses stay float32/float64. null = follow training.dtype.",
      [](Config& c) -> void* { return &c.training.precision; })
      .choices = {"64-true", "32-true", "bf16-mixed", "16-mixed"};
  t.add("training.device", Kind::kString, "",
      "Device to train on: cpu, cuda or cuda:N (needs a CUDA build of LibTorch).",
      [](Config& c) -> void* { return &c.training.device; });
  min_incl(t.add("training.max_batches_without_step", Kind::kInt, "",
               "Stop the run (exit code 3, with a checkpoint) once this many batches in a row end "
               "without an optimizer step, e.g. when spike skipping vetoes every step of a diverged "
               "model; 0 = never.",
               [](Config& c) -> void* { return &c.training.max_batches_without_step; }),
           0.0);
  min_incl(t.add("training.num_threads", Kind::kInt, "",
               "CPU threads of LibTorch's intra-op pool; 0 = auto: OMP_NUM_THREADS where set, else the "
               "faster of 1 thread and this worker's cores (its CPU affinity over the data-parallel "
               "workers on this machine), measured on the first batch before the first step.",
               [](Config& c) -> void* { return &c.training.num_threads; }),
           0.0);
}

}  // namespace crucible::config_schema
