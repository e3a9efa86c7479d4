#include "mace_names.h"

#include <map>
#include <set>

namespace crucible::config_detail {

const char* mace_recipe_yaml() {
  // MACE's defaults (mace v0.3.14 mace/tools/arg_parser.py) where they
  // differ from Crucible's; configs/mace.yaml spells the same values out.
  // Not carried over: weight_decay 5e-7 on the interactions' linear weights
  // only (a param group Crucible's no_weight_decay regex cannot select
  // the same way), and max_num_epochs 2048 (Crucible's num_epochs stays).
  return R"(
model:
  scaling: rms_forces_scaling   # --scaling
  shift: zero                   # --model MACE: atomic_inter_shift 0
training:
  batch_size: 10                # --batch_size
  optimizer:
    name: adam
    amsgrad: true               # --amsgrad
    lr: 0.01                    # --lr
  scheduler:
    name: plateau               # --scheduler ReduceLROnPlateau on the validation loss
    monitor: loss
    factor: 0.8                 # --lr_factor
    patience: 50                # --scheduler_patience
  clip_grad_norm: 10.0          # --clip_grad
  loss:
    energy_weight: 1.0          # --energy_weight
    forces_weight: 100.0        # --forces_weight
    stress_weight: 1.0          # --stress_weight (--loss stress), where the data has stress
    energy_per_atom: true
  ema:
    enabled: true               # --ema
    decay: 0.99                 # --ema_decay
    warmup: true                # torch_ema use_num_updates
  stage_two:
    enabled: true               # --swa; start: max(1, num_epochs // 4 * 3)
    lr: 0.001                   # --swa_lr
    energy_weight: 1000.0       # --swa_energy_weight
    forces_weight: 100.0        # --swa_forces_weight
    stress_weight: 10.0         # --swa_stress_weight
  early_stopping:
    monitor: loss
    patience: 2048              # --patience
)";
}

namespace {

struct Hint {
  const char* mace;
  const char* crucible;
};

// MACE argument → what to set in Crucible (mace/tools/arg_parser.py names).
const std::map<std::string, std::string>& hints() {
  static const std::map<std::string, std::string> h = [] {
    const Hint table[] = {
        {"r_max", "set model.cutoff (Å)"},
        {"num_channels",
         "set model.mace.hidden_irreps: num_channels C with max_L L is C copies of each irrep up to "
         "L, e.g. num_channels 128, max_L 1 is '128x0e+128x1o'"},
        {"max_L",
         "set model.mace.hidden_irreps: num_channels C with max_L L is C copies of each irrep up to "
         "L, e.g. num_channels 128, max_L 1 is '128x0e+128x1o' (model.mace.max_ell is the "
         "harmonics' order, MACE's max_ell)"},
        {"hidden_irreps", "set model.mace.hidden_irreps"},
        {"max_ell", "set model.mace.max_ell"},
        {"correlation", "set model.mace.correlation"},
        {"num_interactions", "set model.mace.num_interactions"},
        {"num_radial_basis", "set model.mace.num_bessel"},
        {"num_cutoff_basis", "set model.mace.num_polynomial_cutoff"},
        {"radial_MLP", "set model.mace.radial_mlp (a list, e.g. [64, 64, 64])"},
        {"MLP_irreps", "set model.mace.mlp_irreps"},
        {"pair_repulsion", "set model.mace.pair_repulsion: true"},
        {"avg_num_neighbors", "set model.mace.avg_num_neighbors"},
        {"E0s", "set data.e0s (MACE's average is least_squares; isolated, foundation, estimated "
                "and a map {H: -13.6} work as in MACE)"},
        {"train_file", "set data.train_file"},
        {"valid_file", "set data.valid_file"},
        {"valid_fraction", "set data.valid_fraction"},
        {"test_file", "evaluate a test set after training with crucible evaluate RUN_DIR FILE"},
        {"energy_key", "set data.energy_key"},
        {"forces_key", "set data.forces_key"},
        {"stress_key", "set data.stress_key"},
        {"virials_key", "set data.virial_key"},
        {"model", "set model.type: mace (MACE's model MACE is model.shift zero, ScaleShiftMACE "
                  "model.shift mean)"},
        {"scaling", "set model.scaling"},
        {"batch_size", "set training.batch_size"},
        {"valid_batch_size", "set training.valid_batch_size"},
        {"max_num_epochs", "set training.num_epochs"},
        {"lr", "set training.optimizer.lr"},
        {"amsgrad", "set training.optimizer.amsgrad"},
        {"optimizer", "set training.optimizer.name"},
        {"weight_decay", "set training.optimizer.weight_decay"},
        {"scheduler", "set training.scheduler.name (ReduceLROnPlateau is plateau, ExponentialLR "
                      "is exponential)"},
        {"lr_factor", "set training.scheduler.factor"},
        {"scheduler_patience", "set training.scheduler.patience"},
        {"lr_scheduler_gamma", "set training.scheduler.gamma with training.scheduler.name "
                               "exponential"},
        {"clip_grad", "set training.clip_grad_norm"},
        {"loss", "set training.loss.energy_weight, forces_weight and stress_weight (weighted is "
                 "energy and forces; stress adds stress_weight)"},
        {"energy_weight", "set training.loss.energy_weight"},
        {"forces_weight", "set training.loss.forces_weight"},
        {"stress_weight", "set training.loss.stress_weight"},
        {"virials_weight", "set training.loss.stress_weight (virials are trained as stress)"},
        {"config_type_weights", "set training.loss.config_type_weights"},
        {"ema", "set training.ema.enabled"},
        {"ema_decay", "set training.ema.decay"},
        {"swa", "set training.stage_two.enabled"},
        {"stage_two", "set training.stage_two.enabled"},
        {"start_swa", "set training.stage_two.start_epoch"},
        {"start_stage_two", "set training.stage_two.start_epoch"},
        {"swa_lr", "set training.stage_two.lr"},
        {"stage_two_lr", "set training.stage_two.lr"},
        {"swa_energy_weight", "set training.stage_two.energy_weight"},
        {"swa_forces_weight", "set training.stage_two.forces_weight"},
        {"swa_stress_weight", "set training.stage_two.stress_weight"},
        {"patience", "set training.early_stopping.patience"},
        {"eval_interval", "set training.validate_every_n_epochs"},
        {"seed", "set training.seed"},
        {"default_dtype", "set training.dtype"},
        {"device", "set training.device"},
        {"name", "set output.run_dir"},
        {"work_dir", "set output.run_dir"},
        {"checkpoints_dir", "set output.run_dir (checkpoints go to its checkpoints/)"},
        {"results_dir", "set output.run_dir"},
        {"model_dir", "set output.run_dir"},
        {"log_dir", "set output.run_dir"},
        {"keep_checkpoints", "set output.keep_last_checkpoints"},
        {"restart_latest", "resume with crucible train --resume RUN_DIR"},
        {"foundation_model", "set model.init_from (a MACE _compiled.model, or a .pt with its "
                             "hyper-parameters as .json; see docs/mace_import.md)"},
        {"distributed", "run crucible train --nproc N"},
        {"save_cpu", "remove it: model.pt is always written on CPU"},
        {"compute_stress", "remove it: stress is trained where the data has it and "
                           "training.loss.stress_weight > 0"},
        {"compute_forces", "remove it: forces are trained where the data has them and "
                           "training.loss.forces_weight > 0"},
    };
    std::map<std::string, std::string> out;
    for (const auto& e : table) out.emplace(e.mace, e.crucible);
    return out;
  }();
  return h;
}

}  // namespace

std::string mace_key_hint(const std::string& path) {
  const bool top_level = path.find('.') == std::string::npos;  // MACE's flat YAML
  const std::string leaf = path.substr(path.rfind('.') + 1);
  // Inside a section, only names no Crucible user would write otherwise
  // ("name" or "seed" under a section is a plain typo, not MACE's).
  static const std::set<std::string> distinctive = {
      "r_max", "num_channels", "max_L", "E0s", "radial_MLP", "MLP_irreps", "num_radial_basis",
      "num_cutoff_basis", "swa", "start_swa", "start_stage_two", "swa_lr", "stage_two_lr",
      "swa_energy_weight", "swa_forces_weight", "swa_stress_weight", "ema_decay",
      "max_num_epochs", "clip_grad", "lr_factor", "scheduler_patience", "lr_scheduler_gamma",
      "virials_key", "virials_weight", "default_dtype", "foundation_model", "restart_latest",
      "eval_interval", "keep_checkpoints", "compute_stress", "compute_forces", "save_cpu"};
  if (!top_level && distinctive.count(leaf) == 0) return "";
  auto it = hints().find(leaf);
  if (it == hints().end()) return "";
  return "is MACE's --" + leaf + "; in Crucible " + it->second;
}

}  // namespace crucible::config_detail
