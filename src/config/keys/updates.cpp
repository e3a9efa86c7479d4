// Recipe keys, training.* update hooks: clipping, freezing, gradient accumulation, spike skipping, data parallel, replay, EMA, stage two, early stopping (crucible/training/).

#include "../schema.h"

#include "crucible/models/registry.h"
#include "crucible/training/metrics.h"

#include <string>
#include <variant>
#include <vector>

namespace crucible::config_schema {

void add_update_keys(KeyTable& t) {
  min_incl(t.add("training.clip_grad_norm", Kind::kFloat, "",
               "Clip the 2-norm of all parameter gradients to this value before each "
               "optimizer step (MACE clip_grad); 0 = no clipping.",
               [](Config& c) -> void* { return &c.training.clip_grad_norm; }),
           0.0);
  t.add("training.freeze", Kind::kString, "",
      "Fine-tuning: parameters whose name matches this regular expression (ECMAScript, searched "
      "anywhere in the name, e.g. 'embedding|interactions\\.0\\.') are kept fixed: not given to "
      "the optimizer, requires_grad false. Names as in `crucible info` / models.json. \"\" = train "
      "all.",
      [](Config& c) -> void* { return &c.training.freeze; });
  {
    Key& key = t.add("training.gradient_accumulation_steps", Kind::kInt, "",
                   "Accumulate the gradients of this many batches before each optimizer step "
                   "(the loss of each batch is divided by it); 1 = no accumulation. "
                   "num_epochs counts batches, so an epoch has 1/n as many optimizer steps. "
                   "At most 1000000, and at most the batches a num_epochs run has.",
                   [](Config& c) -> void* { return &c.training.gradient_accumulation_steps; });
    min_incl(key, 1.0);
    key.max = 1e6;
    key.max_inclusive = true;
  }
  t.add("training.spike_skipping.enabled", Kind::kBool, "",
      "Skip the optimizer step of a batch whose loss or gradient norm is not finite, or "
      "whose loss exceeds median + k * MAD of the last accepted losses.",
      [](Config& c) -> void* { return &c.training.spike_skipping.enabled; });
  min_excl(t.add("training.spike_skipping.k", Kind::kFloat, "",
               "Spike threshold in median absolute deviations above the median.",
               [](Config& c) -> void* { return &c.training.spike_skipping.k; }),
           0.0);
  min_incl(t.add("training.spike_skipping.window", Kind::kInt, "",
               "Number of most recent accepted losses the median and MAD use.",
               [](Config& c) -> void* { return &c.training.spike_skipping.window; }),
           1.0);
  min_incl(t.add("training.spike_skipping.min_history", Kind::kInt, "",
               "Accepted losses needed before a loss can be judged a spike (<= window).",
               [](Config& c) -> void* { return &c.training.spike_skipping.min_history; }),
           1.0);
  min_excl(t.add("training.distributed.timeout_s", Kind::kFloat, "",
               "Data-parallel runs: a collective (gradient all-reduce, validation sums) that "
               "waits longer than this fails, naming the worker that stopped answering.",
               [](Config& c) -> void* { return &c.training.distributed.timeout_s; }),
           0.0);
  min_excl(t.add("training.distributed.bucket_cap_mb", Kind::kFloat, "",
               "Data-parallel runs: gradients are flattened into buckets of at most this many "
               "MiB, one all-reduce each (PyTorch DDP's bucket_cap_mb).",
               [](Config& c) -> void* { return &c.training.distributed.bucket_cap_mb; }),
           0.0);
  t.add("training.distributed.drop_last", Kind::kBool, "",
      "Data-parallel runs: drop the tail of the shuffled training set so every worker gets "
      "the same number of structures (PyTorch DistributedSampler drop_last); false pads by "
      "repeating the first structures.",
      [](Config& c) -> void* { return &c.training.distributed.drop_last; });
  t.add("training.replay.file", Kind::kOptString, "",
      "Fine-tuning: structures of the original training data (any data.format, same keys and "
      "units) of which training.replay.fraction x (training structures) are drawn anew every "
      "epoch and trained on with the new data, so the model does not forget them (MACE's "
      "multihead replay). Their elements and energies join the E0 fit. null = no replay.",
      [](Config& c) -> void* { return &c.training.replay.file; });
  min_incl(t.add("training.replay.weight", Kind::kFloat, "",
               "Multiplies the loss weight of replayed structures.",
               [](Config& c) -> void* { return &c.training.replay.weight; }),
           0.0);
  min_excl(t.add("training.replay.fraction", Kind::kFloat, "",
               "Replayed structures per epoch, as a fraction of the training structures (capped "
               "at the replay file's size; at least 1).",
               [](Config& c) -> void* { return &c.training.replay.fraction; }),
           0.0);
  t.add("training.ema.enabled", Kind::kBool, "",
      "Keep an exponential moving average of the model weights (updated after optimizer "
      "steps that ran; MACE's ema).",
      [](Config& c) -> void* { return &c.training.ema.enabled; });
  {
    Key& key = t.add("training.ema.decay", Kind::kFloat, "",
                   "Weight of the old average in each update, in [0, 1).",
                   [](Config& c) -> void* { return &c.training.ema.decay; });
    key.min = 0.0;
    key.max = 1.0;
  }
  min_incl(t.add("training.ema.update_every", Kind::kInt, "",
               "Update the average every n-th optimizer step.",
               [](Config& c) -> void* { return &c.training.ema.update_every; }),
           1.0);
  min_incl(t.add("training.ema.start_step", Kind::kInt, "",
               "First optimizer step (counted from 1) that updates the average; the first "
               "update copies the weights.",
               [](Config& c) -> void* { return &c.training.ema.start_step; }),
           0.0);
  t.add("training.ema.warmup", Kind::kBool, "",
      "Average update k (from 1) with min(decay, (1 + k)/(10 + k)) instead of decay, so early "
      "averages follow the weights (torch_ema use_num_updates, as MACE; 0.99 is reached at k = "
      "890).",
      [](Config& c) -> void* { return &c.training.ema.warmup; });
  t.add("training.ema.use_for_validation", Kind::kBool, "",
      "Validate, report and save model.pt with the averaged weights instead of the live "
      "ones (MACE and Lightning EMA callbacks do so).",
      [](Config& c) -> void* { return &c.training.ema.use_for_validation; });
  t.add("training.stage_two.enabled", Kind::kBool, "",
      "MACE's stage two (its SWA stage, --swa): from training.stage_two.start_epoch on, the loss "
      "weights jump to the stage-two weights and the learning rate is held at "
      "training.stage_two.lr (the schedule stops); the best model is then chosen among "
      "stage-two validations. Not with a training.loss.schedule.",
      [](Config& c) -> void* { return &c.training.stage_two.enabled; });
  min_incl(t.add("training.stage_two.start_epoch", Kind::kOptInt, "",
               "First epoch (counted from 0) of stage two, < training.num_epochs. null = "
               "max(1, floor(num_epochs / 4) * 3), MACE's default (needs training.num_epochs).",
               [](Config& c) -> void* { return &c.training.stage_two.start_epoch; }),
           0.0);
  min_excl(t.add("training.stage_two.lr", Kind::kFloat, "",
               "Learning rate of stage two (MACE swa_lr).",
               [](Config& c) -> void* { return &c.training.stage_two.lr; }),
           0.0);
  min_incl(t.add("training.stage_two.energy_weight", Kind::kFloat, "",
               "Energy weight of stage two (MACE swa_energy_weight).",
               [](Config& c) -> void* { return &c.training.stage_two.energy_weight; }),
           0.0);
  min_incl(t.add("training.stage_two.forces_weight", Kind::kFloat, "",
               "Forces weight of stage two (MACE swa_forces_weight).",
               [](Config& c) -> void* { return &c.training.stage_two.forces_weight; }),
           0.0);
  min_incl(t.add("training.stage_two.stress_weight", Kind::kFloat, "",
               "Stress weight of stage two (MACE swa_stress_weight); used where the data has "
               "stresses.",
               [](Config& c) -> void* { return &c.training.stage_two.stress_weight; }),
           0.0);
  t.add("training.early_stopping.monitor", Kind::kString, "",
      "Validation monitor whose lowest value picks the best model (model.pt with "
      "output.model_pt = best) and drives early stopping: loss (the weighted training loss on "
      "the validation set with the weights of the current stage, MACE's validation loss) or a "
      "metric (energy_mae, energy_rmse, forces_mae, forces_rmse, stress_mae, stress_rmse; a "
      "val/ prefix is accepted).",
      [](Config& c) -> void* { return &c.training.early_stopping.monitor; })
      .choices = validation_monitor_names();
  min_incl(t.add("training.early_stopping.patience", Kind::kInt, "",
               "Finish the run after this many validations in a row without a lower "
               "training.early_stopping.monitor (MACE --patience); 0 = never.",
               [](Config& c) -> void* { return &c.training.early_stopping.patience; }),
           0.0);
}

}  // namespace crucible::config_schema
