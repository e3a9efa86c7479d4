#pragma once
// Run configuration: the YAML schema of `crucible train`, its defaults,
// documentation, validation and `key.path=value` command-line overrides.
//
// The struct tree below is plain C++ (no yaml-cpp types); src/config/config.cpp
// holds the one schema table that drives loading, overrides, dumping and the
// key documentation (docs/config.md mirrors it).

#include "crucible/models/model_params.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

struct SchedulerConfig;
struct OptimizerConfig;
class LossFunction;
class LossWeightSchedule;
class WeightedSumLoss;

/// Physical quantity a unit setting converts (selects the table of names).
enum class UnitQuantity {
  kEnergy,  ///< energies and virials → eV.
  kForces,  ///< forces → eV/Å.
  kStress,  ///< stresses → eV/Å³.
};

/// A unit as the user wrote it plus the multiplier to Crucible's units.
/// `factor` multiplies values read from the file: value_eV = factor · value_file.
struct UnitSetting {
  std::string name;     ///< named unit ("kcal/mol", "eV/Å"); empty if given as a number.
  double factor = 1.0;  ///< multiplier to eV / eV/Å / eV/Å³; finite and > 0.

  /// The name, or the factor (shortest text that reads back exactly).
  std::string to_string() const;
  bool operator==(const UnitSetting& o) const { return name == o.name && factor == o.factor; }
  bool operator!=(const UnitSetting& o) const { return !(*this == o); }
};

/// Parses a named unit (case-insensitive ASCII; "Å" and "A" both mean ångström).
/// Energy: eV, meV, kcal/mol, kJ/mol, Hartree (Ha), Ry. Forces: <energy>/Å,
/// <energy>/A, <energy>/Bohr. Stress: <energy>/Å^3 (also Å³, A^3, A3,
/// Bohr^3), GPa, kbar. Values from CODATA 2018 (N_A·e = 96485.33212 C/mol,
/// Hartree = 27.211386245988 eV, Bohr = 0.529177210903 Å).
/// @return the multiplier to eV units, or std::nullopt if `text` is not a known name.
std::optional<double> named_unit_factor(UnitQuantity quantity, const std::string& text);

/// Named units accepted for `quantity`, canonical spellings, for messages.
std::vector<std::string> unit_names(UnitQuantity quantity);

/// `data` section: which files to read and how to interpret them.
/// data.e0s (issue 18): where the per-element reference energies E0 come
/// from. `mode` is least_squares (fit on the training energies), isolated
/// (isolated-atom frames of the training file), zero, map (`values`) or
/// file (`file`, a JSON object of element (symbol or Z) to eV).
struct E0Setting {
  std::string mode = "least_squares";
  std::map<std::string, double> values;  ///< mode map: element symbol → eV.
  std::string file;                      ///< mode file: JSON path.
  bool operator==(const E0Setting& o) const { return mode == o.mode && values == o.values && file == o.file; }
  bool operator!=(const E0Setting& o) const { return !(*this == o); }
};

struct DataConfig {
  std::string train_file = "data/alloy_TiAl/TiAl_tutorial.xyz";  ///< extxyz path.
  std::optional<std::string> valid_file;  ///< extxyz path; unset = split train_file.
  double valid_fraction = 0.1;            ///< fraction of train_file held out, in (0, 1).
  int64_t seed = 1;                       ///< seed of the train/validation split, >= 0.
  std::string energy_key = "energy";      ///< header key of the total energy.
  std::string forces_key = "";            ///< Properties column; "" = forces, else force.
  std::string stress_key = "stress";      ///< header key of the stress.
  std::string virial_key = "virial";      ///< header key of the virial.
  UnitSetting energy_unit{"eV", 1.0};     ///< file energy unit (also virials).
  UnitSetting forces_unit{"eV/Å", 1.0};   ///< file force unit.
  UnitSetting stress_unit{"eV/Å^3", 1.0}; ///< file stress unit.
  E0Setting e0s;                          ///< reference energies E0 (data.e0s).
  std::string format = "auto";            ///< auto, extxyz or deepmd (data.format).
};

/// `model` section: the architecture and its hyperparameters. The config
/// layer knows only `model.type` and `model.cutoff`; each registered model
/// (crucible/models/registry.h) declares its own model.<type>.* keys, whose
/// values live in `params` ("mace.hidden_irreps" → "32x0e+32x1o").
struct ModelConfig {
  std::string type = "schnet";   ///< a registered model type (schnet, mace).
  double cutoff = 5.0;           ///< neighbor cutoff, Å, > 0.
  ModelParams params = default_model_params();  ///< every model's keys.
  /// Start from this trained model's weights (run directory or model.pt);
  /// unset = random initialization (issue 18, fine-tuning).
  std::optional<std::string> init_from;
  /// Scale of the learned energy (MACE --scaling): rms_forces_scaling (RMS
  /// of the force components), std_scaling (std of the per-atom residual
  /// energy) or no_scaling (1).
  std::string scaling = "rms_forces_scaling";
  /// Shift of the learned per-atom energy: mean (mean per-atom residual
  /// energy, MACE's ScaleShiftMACE) or zero (MACE's default model "MACE").
  std::string shift = "mean";
};

/// `training.optimizer` section.
/// Options an optimizer does not have must keep their defaults
/// (validate_config rejects them otherwise).
struct OptimizerSettings {
  std::string name = "adam";  ///< adam, adamw, sgd, rmsprop or adagrad.
  double lr = 5e-3;           ///< learning rate, > 0.
  double weight_decay = 0.0;  ///< >= 0 (L2; decoupled for adamw).
  double beta1 = 0.9;         ///< adam/adamw, in [0, 1).
  double beta2 = 0.999;       ///< adam/adamw, in [0, 1).
  double eps = 1e-8;          ///< adam/adamw/rmsprop/adagrad, > 0.
  bool amsgrad = false;       ///< adam/adamw.
  double momentum = 0.0;      ///< sgd/rmsprop, >= 0.
  double dampening = 0.0;     ///< sgd, >= 0.
  bool nesterov = false;      ///< sgd.
  double alpha = 0.99;        ///< rmsprop, in [0, 1).
  bool centered = false;      ///< rmsprop.
  double lr_decay = 0.0;      ///< adagrad, >= 0.
  double initial_accumulator_value = 0.0;  ///< adagrad, >= 0.
  /// Regex of parameter names that get weight_decay 0 (a param group; e.g.
  /// "embedding|bias"); "" = none.
  std::string no_weight_decay;
};

/// `training.spike_skipping` section: SpikeSkippingHook (skip the optimizer
/// step of a batch with a non-finite loss/gradient or a loss spike).
struct SpikeSkippingSettings {
  bool enabled = false;       ///< register the hook.
  double k = 10.0;            ///< spike threshold in MADs above the median, > 0.
  int64_t window = 50;        ///< accepted losses the statistic uses, >= 1.
  int64_t min_history = 10;   ///< accepted losses before spikes are judged, in [1, window].
};

/// `training.ema` section: EmaHook (exponential moving average of the weights).
struct EmaSettings {
  bool enabled = false;       ///< register the hook.
  double decay = 0.999;       ///< weight of the old average, in [0, 1).
  int64_t update_every = 1;   ///< update every n-th optimizer step, >= 1.
  int64_t start_step = 0;     ///< first optimizer step (1-based) that updates, >= 0.
  bool use_for_validation = true;  ///< validate and save model.pt with the average.
  bool warmup = false;        ///< torch_ema use_num_updates: min(decay, (1+k)/(10+k)).
};

/// `training.stage_two` section: MACE's second stage (its SWA stage,
/// --swa / --start_swa): from start_epoch on, the loss weights jump to the
/// stage-two weights and the learning rate is held at `lr`
/// (training/stage_two.h; the weights as a step loss schedule).
struct StageTwoSettings {
  bool enabled = false;
  /// First epoch of stage two (0-based); unset = max(1, ⌊num_epochs/4⌋·3), MACE's default.
  std::optional<int64_t> start_epoch;
  double lr = 1e-3;              ///< MACE swa_lr, > 0.
  double energy_weight = 1000.0; ///< MACE swa_energy_weight, >= 0.
  double forces_weight = 100.0;  ///< MACE swa_forces_weight, >= 0.
  double stress_weight = 10.0;   ///< MACE swa_stress_weight, >= 0.
};

/// `training.early_stopping` section: BestModelHook (training/best_model.h).
struct EarlyStoppingSettings {
  std::string monitor = "loss";  ///< validation monitor; also picks the best model.
  int64_t patience = 0;          ///< validations without improvement; 0 = never stop.
};

/// `training.replay` section (issue 18, fine-tuning): a share of the
/// original training data mixed into every epoch so the model does not
/// forget it (MACE's multihead replay of pt_train_file).
struct ReplaySettings {
  std::optional<std::string> file;  ///< structures to replay; unset = no replay.
  double weight = 1.0;    ///< multiplies the replayed structures' loss weight, >= 0.
  double fraction = 0.1;  ///< replayed structures per epoch / training structures, > 0.
};

/// `training.distributed` section: data-parallel training (issue 6). The
/// world (rank, size, master) comes from the environment (torchrun, SLURM,
/// Open MPI) or `crucible train --nproc N`, never from the config.
struct DistributedSettings {
  double timeout_s = 120.0;     ///< a collective waiting longer fails (dead worker), > 0.
  double bucket_cap_mb = 25.0;  ///< gradient all-reduce bucket size (DDP's bucket_cap_mb), > 0.
  bool drop_last = false;       ///< DistributedSampler drop_last: drop the tail instead of padding.
};

/// `training.loss` section: weights of the loss terms.
struct LossSettings {
  double energy_weight = 1.0;   ///< weight of the energy term, >= 0.
  double forces_weight = 1.0;   ///< weight of the forces term, >= 0.
  double stress_weight = 1.0;   ///< weight of the stress term, >= 0.
  bool energy_per_atom = true;  ///< energy term on E/N instead of E.
  std::string kind = "mse";     ///< mse, mae or huber (every term).
  double huber_delta = 0.01;    ///< huber: delta (eV/atom, eV/Å, eV/Å³), > 0.
  std::string forces_mode = "component";  ///< component or vector (per-atom norm).
  bool normalize_weights = false;  ///< total / Σ weights.
  /// config_type → weight of its structures in every term (MACE
  /// config_type_weights); types not listed weigh 1.
  std::map<std::string, double> config_type_weights;
  /// Weight schedule of all three terms: constant, linear, cosine, or step
  /// (jump to the final weights at schedule_start, MACE's SWA stage).
  std::string schedule = "constant";
  std::string schedule_clock = "epoch";  ///< epoch or step.
  int64_t schedule_start = 0;   ///< first epoch/step of the change, >= 0.
  int64_t schedule_end = 0;     ///< linear/cosine: last epoch/step, >= start.
  double energy_weight_final = 1.0;  ///< weight at / after the end.
  double forces_weight_final = 1.0;
  double stress_weight_final = 1.0;
};

/// `training.scheduler` section: learning-rate schedule over the whole run
/// (crucible/training/lr_scheduler.h). Options a schedule does not use must
/// keep their defaults (validate_config rejects them otherwise).
struct SchedulerSettings {
  /// "constant", "cosine", "step", "exponential" or "plateau".
  std::string name = "cosine";
  double final_lr_factor = 0.01; ///< cosine: final lr / initial lr, in [0, 1].
  int64_t step_size = 1000;      ///< step: optimizer steps between decays, >= 1.
  double gamma = 0.5;            ///< step / exponential: decay factor, in (0, 1].
  int64_t warmup_steps = 0;      ///< linear warmup steps (not with plateau), >= 0.
  double warmup_start_factor = 0.1;  ///< lr at warmup step 0 / lr, in [0, 1].
  std::string monitor = "forces_mae";  ///< plateau: validation metric.
  double factor = 0.1;           ///< plateau: lr multiplier, in (0, 1).
  int64_t patience = 10;         ///< plateau: validations without improvement, >= 0.
  double threshold = 1e-4;       ///< plateau: relative improvement, >= 0.
  int64_t cooldown = 0;          ///< plateau: validations after a reduction, >= 0.
  double min_lr = 0.0;           ///< plateau: lower bound of the lr, >= 0.
};

/// `training` section.
struct TrainingConfig {
  std::optional<int64_t> num_epochs = 60;  ///< exactly one of num_epochs / num_steps.
  std::optional<int64_t> num_steps;        ///< optimizer steps.
  int64_t batch_size = 4;                  ///< structures per training batch, >= 1.
  int64_t valid_batch_size = 32;           ///< structures per validation batch, >= 1.
  int64_t seed = 42;                       ///< torch manual seed and shuffle seed, >= 0.
  OptimizerSettings optimizer;
  SchedulerSettings scheduler;
  LossSettings loss;
  double clip_grad_norm = 10.0;            ///< max gradient 2-norm; 0 = no clipping.
  std::string freeze;                      ///< regex of parameter names kept fixed; "" = none.
  ReplaySettings replay;                   ///< fine-tuning replay (training.replay.*).
  int64_t gradient_accumulation_steps = 1; ///< batches per optimizer step, >= 1.
  SpikeSkippingSettings spike_skipping;
  EmaSettings ema;
  StageTwoSettings stage_two;
  EarlyStoppingSettings early_stopping;
  DistributedSettings distributed;
  int64_t validate_every_n_epochs = 1;     ///< 0 = only after training.
  int64_t validate_every_n_steps = 0;      ///< also every n optimizer steps; 0 = off.
  /// Validation autocast: auto, always or never.
  std::string validate_with_mixed_precision = "auto";
  std::string dtype = "float64";           ///< "float32" or "float64".
  /// Precision mode (issue 3): "64-true", "32-true", "bf16-mixed" or
  /// "16-mixed"; unset (null) = follow `dtype` (float64 → 64-true, float32 →
  /// 32-true). When set it overrides `dtype` for the model and batches.
  std::optional<std::string> precision;
  std::string device = "cpu";              ///< "cpu", "cuda", "cuda:N".
  int64_t num_threads = 0;                 ///< CPU threads; 0 = auto (training/thread_choice.h).
  int64_t max_batches_without_step = 1000; ///< stop after this many skipped steps in a row; 0 = never.
};

/// `output` section.
struct OutputConfig {
  std::optional<std::string> run_dir;  ///< unset = runs/<YYYYmmdd-HHMMSS>.
  bool overwrite = false;              ///< replace an existing run directory.
  int64_t log_every_n_steps = 10;      ///< metrics.jsonl: a train line every n steps, >= 1.
  int64_t checkpoint_every_n_steps = 0;   ///< checkpoints/ every n steps; 0 = off.
  int64_t checkpoint_every_n_epochs = 1;  ///< checkpoints/ every n epochs; 0 = off.
  int64_t keep_last_checkpoints = 3;      ///< retention (plus the best by forces_mae); 0 = all.
  /// What model.pt holds: "best" (the best validation by
  /// training.early_stopping.monitor; the last weights in model_last.pt) or "last".
  std::string model_pt = "best";
};


/// The whole configuration of `crucible train`.
struct Config {
  DataConfig data;
  ModelConfig model;
  TrainingConfig training;
  OutputConfig output;
};

/// One documented key of the schema.
struct ConfigKeyInfo {
  std::string path;           ///< dotted path, e.g. "training.optimizer.lr".
  std::string type;           ///< "string", "integer", "number", "boolean", "unit", with "or null".
  std::string default_value;  ///< YAML text of the default.
  std::string units;          ///< physical unit, "" if dimensionless.
  std::string doc;            ///< what the key means.
};

/// The keys whose change makes a checkpoint unfit to resume (model, data,
/// batching, seed, dtype/precision, optimizer and schedule kind): a list of
/// "key: <saved> -> <now>" for each that differs between two configs.
std::vector<std::string> recipe_differences(const Config& saved, const Config& now);

/// The defaults (what an empty config file gives).
Config default_config();

/// Loss term `name` ("energy", "forces" or "stress") of the
/// `training.loss` section: its kind (mse/mae/huber with huber_delta),
/// energy_per_atom, forces_mode. @throws ConfigError for another name.
std::shared_ptr<LossFunction> loss_term(const LossSettings& loss, const std::string& name);

/// The weight schedule of term `name`: ConstantWeight(<name>_weight), or
/// linear / cosine / step (piecewise) from <name>_weight to
/// <name>_weight_final on the schedule_clock counter.
std::shared_ptr<const LossWeightSchedule> loss_weight_schedule(const LossSettings& loss,
                                                               const std::string& name);

/// The whole `training.loss` section as a WeightedSumLoss: the energy,
/// forces and stress terms (loss_term) with their weight schedules, the
/// config_type weights and the normalization flag. Terms are kept whatever
/// labels the data has (a term with no labels in a batch contributes 0);
/// `crucible train` instead drops terms its training data cannot feed.
WeightedSumLoss loss_from_settings(const LossSettings& loss);

/// First epoch (0-based) of training.stage_two: start_epoch, or MACE's
/// default max(1, ⌊E/4⌋·3) with E = num_epochs, or `run_epochs` (the epochs
/// a num_steps run makes, ⌈steps / optimizer steps per epoch⌉) when
/// num_steps is set; unset when stage two is off.
/// @throws ConfigError when the default is needed and neither is known.
std::optional<int64_t> stage_two_start_epoch(const TrainingConfig& training,
                                             std::optional<int64_t> run_epochs = std::nullopt);

/// training.loss with training.stage_two folded in: when stage two is on,
/// a step schedule on the epoch clock at stage_two_start_epoch() to the
/// stage-two weights (validate_config has refused any other schedule then);
/// else training.loss unchanged. @throws ConfigError as stage_two_start_epoch.
LossSettings effective_loss_settings(const TrainingConfig& training,
                                     std::optional<int64_t> run_epochs = std::nullopt);

/// The largest weight term `name` takes over the run (0 = the term is off).
double max_loss_weight(const LossSettings& loss, const std::string& name);

/// The `training.optimizer` and `training.scheduler` sections as the
/// strategy's OptimizerConfig: only the options of the chosen optimizer are
/// set; `no_weight_decay` becomes a param group with weight_decay 0.
OptimizerConfig optimizer_config(const TrainingConfig& training);

/// The `training.scheduler` section as the strategy's SchedulerConfig
/// (t_max 0: the cosine anneal spans the run after the warmup).
SchedulerConfig scheduler_config(const SchedulerSettings& settings);

/// Every key of the schema, in documentation order.
std::vector<ConfigKeyInfo> config_keys();

/// Documentation of the sections ("data", "training.optimizer", ...) in order.
std::vector<std::pair<std::string, std::string>> config_sections();

/// Largest config or spec text accepted (1 MiB): real ones are a few kB.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;
/// Longest string value accepted for a config key or weight-map name.
inline constexpr std::size_t kMaxConfigStringLength = 4096;
/// Deepest nesting of JSON arrays / objects accepted in a spec.
inline constexpr int kMaxSpecDepth = 16;

/// The whole text of a config or spec file, read only after its size was
/// checked. `what` ("config file", "spec file") starts the messages.
/// @throws ConfigError "<what> '<path>' cannot be opened (...)" or
///         "<what> '<path>' must be at most 1048576 bytes, got N bytes".
std::string read_config_text(const std::string& path, const std::string& what);

/// Applies a YAML document (text) on top of `config`. `source` names it in
/// errors (a file name). An empty document changes nothing.
/// Bounded: text over kMaxConfigBytes, a string value over
/// kMaxConfigStringLength characters or YAML nested deeper than yaml-cpp's
/// guard (2000 levels) is a ConfigError.
/// @throws ConfigError for invalid YAML ("<source>:<line>:<col>: invalid YAML: ..."),
///         an unknown key ("unknown config key 'a.b' in <source> (line L); known
///         keys: ..."), a value of the wrong type or out of range (naming the
///         dotted path, expected type, the value and the line), or both
///         training.num_epochs and training.num_steps set in the document.
///         Setting one of those two unsets the other.
void apply_config_yaml(Config& config, const std::string& yaml_text, const std::string& source);

/// The recipe a model type brings, as YAML applied over the built-in
/// defaults and under the user's file and overrides ("" for none). mace:
/// MACE's run_train defaults where they differ from Crucible's (AMSGrad lr
/// 0.01, batch 10, plateau schedule on the validation loss, forces weight
/// 100, stress weight 1, EMA 0.99 with warmup, stage two, patience 2048,
/// shift zero); src/config/mace_names.cpp lists them with MACE's names.
std::string model_type_recipe(const std::string& model_type);

/// The configuration `crucible train` runs: default_config(), the recipe of
/// the model.type that the file and overrides give (model_type_recipe),
/// then the file (`config_file`, "" = none), then the overrides. A saved
/// run's config.yaml lists every key, so it reads back the same either way.
/// @throws ConfigError as load_config_file and apply_overrides.
Config load_run_config(const std::string& config_file, const std::vector<std::string>& overrides);

/// load_run_config with the recipe given as YAML (or JSON) text instead of a
/// file (`crucible.train(config=dict)`); `source` names it in messages.
/// @throws ConfigError as apply_config_yaml and apply_overrides.
Config load_run_config_text(const std::string& yaml_text, const std::string& source,
                            const std::vector<std::string>& overrides);

/// default_config() with the YAML file `path` applied.
/// @throws ConfigError if the file cannot be read or is invalid (see apply_config_yaml).
Config load_config_file(const std::string& path);

/// Applies command-line overrides "key.path=value" in order; each value is
/// parsed as YAML (so `training.num_epochs=3` is an integer, `data.valid_file=`
/// is null) and checked like a file value. Setting both training.num_epochs
/// and training.num_steps in one call is an error.
/// @throws ConfigError naming the override for a missing '=', an unknown key,
///         a wrong type or an out-of-range value.
void apply_overrides(Config& config, const std::vector<std::string>& assignments);

/// Checks every value range and the cross-key rules (exactly one of
/// num_epochs / num_steps; some loss weight > 0; a valid device string).
/// @throws ConfigError "<path> must be <expected>, got <actual>".
void validate_config(const Config& config);

/// The configuration as YAML with every key; with `comments`, each key is
/// preceded by its documentation. load(dump(c)) == c.
std::string dump_config(const Config& config, bool comments = true);

/// Markdown table of every key (path, type, default, units, meaning).
std::string config_keys_markdown();

/// The recipe as a JSON spec (issue 5, seed 002 to_spec_dict): {"format":
/// "crucible-spec", "spec_version": 1, "config": {every key, nested by
/// section, with its typed value}}. Deterministic: the same config gives
/// the same text.
std::string config_to_spec_json(const Config& config);

/// Reads a spec written by config_to_spec_json (from_spec): starts from the
/// defaults, applies every key of "config" (unknown keys and wrong types
/// are ConfigErrors naming the key path and the line), then validates.
/// `source` names the text in messages.
/// Bounded like apply_config_yaml, and JSON nested deeper than
/// kMaxSpecDepth is a ConfigError.
/// @throws ConfigError for invalid JSON ("<source>:<line>:<col>"), a missing
///   or other format / spec_version, a top-level key other than format,
///   spec_version and config, or any config error.
Config config_from_spec_json(const std::string& text, const std::string& source);

bool operator==(const Config& a, const Config& b);
inline bool operator!=(const Config& a, const Config& b) { return !(a == b); }

}  // namespace crucible
