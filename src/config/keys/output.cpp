// Recipe keys, output.*: the run directory, checkpoints, metrics cadence, model.pt (src/run/).

#include "../schema.h"

#include "crucible/models/registry.h"

#include <string>
#include <variant>
#include <vector>

namespace crucible::config_schema {

void add_output_keys(KeyTable& t) {
  // output
  t.add("output.run_dir", Kind::kOptString, "",
      "Directory for config.yaml, metrics.csv, model.pt, model.json and summary.json. "
      "null = runs/<YYYYmmdd-HHMMSS> in the current directory.",
      [](Config& c) -> void* { return &c.output.run_dir; });
  t.add("output.overwrite", Kind::kBool, "",
      "Allow writing into an existing run directory (a finished run there is replaced).",
      [](Config& c) -> void* { return &c.output.overwrite; });
  min_incl(t.add("output.checkpoint_every_n_steps", Kind::kInt, "",
               "Write a checkpoint (run_dir/checkpoints/) after every n-th optimizer step; 0 = "
               "off. SIGINT/SIGTERM also write one after the current batch.",
               [](Config& c) -> void* { return &c.output.checkpoint_every_n_steps; }),
           0.0);
  min_incl(t.add("output.checkpoint_every_n_epochs", Kind::kInt, "",
               "Write a checkpoint after every n-th epoch; 0 = off (one is always written at "
               "the end).",
               [](Config& c) -> void* { return &c.output.checkpoint_every_n_epochs; }),
           0.0);
  min_incl(t.add("output.keep_last_checkpoints", Kind::kInt, "",
               "Keep the newest n checkpoints plus the best by validation forces_mae; 0 = keep "
               "all.",
               [](Config& c) -> void* { return &c.output.keep_last_checkpoints; }),
           0.0);
  t.add("output.model_pt", Kind::kString, "",
      "What model.pt holds: best (the weights of the validation with the lowest "
      "training.early_stopping.monitor, as MACE and NequIP export; the last weights are kept "
      "beside it as model_last.pt) or last (the weights after the last step).",
      [](Config& c) -> void* { return &c.output.model_pt; })
      .choices = {"best", "last"};
  min_incl(t.add("output.log_every_n_steps", Kind::kInt, "",
               "metrics.jsonl gets a training line (loss, its terms, lr) at optimizer steps "
               "1, 1+n, 1+2n, ... and a line per validation.",
               [](Config& c) -> void* { return &c.output.log_every_n_steps; }),
           1.0);
}

}  // namespace crucible::config_schema
