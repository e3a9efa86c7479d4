// build_training / load_training_from_checkpoint: a run from its recipe.

#include "crucible/common/dtype_names.h"
#include "crucible/run/training_setup.h"
#include "crucible/run/model_from_data.h"

#include "crucible/run/e0s.h"
#include "crucible/run/fine_tuning.h"
#include "crucible/run/label_keys.h"
#include "crucible/data/label_audit.h"
#include "crucible/data/formats.h"
#include "crucible/models/energy_normalization.h"
#include "crucible/precision/cpu_bf16.h"
#include "crucible/models/registry.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "crucible/run/data_paths.h"
#include "crucible/run/resource_limits.h"
#include "crucible/training/memory_estimate.h"
#include "crucible/common/error.h"
#include "crucible/training/thread_choice.h"
#include "crucible/data/extxyz.h"
#include "crucible/data/structure_checks.h"
#include "crucible/losses/loss.h"
#include "crucible/training/gradient_accumulation.h"
#include "crucible/training/gradient_clipping.h"
#include "crucible/training/best_model.h"
#include "crucible/training/stage_two.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sstream>

namespace crucible {

namespace {

std::vector<Structure> read_file(const std::string& path, const DataConfig& d,
                                 const std::string& key) {
  std::vector<Structure> s = read_structures(path, d.format, extxyz_options(d));
  if (s.empty()) {
    throw DataError(path + ": " + key + " must contain at least one structure, got none");
  }
  check_structures(s, key);  // issue 15: atoms, coordinates, cells, distances, energies
  return s;
}

/// The data of a run, read and checked: the training and validation
/// structures (split or from data.valid_file), the replay pool, the
/// isolated-atom frames of data.e0s isolated, and how validation was chosen.
struct RunData {
  std::string train_path;
  std::vector<Structure> train, valid, replay, isolated;
  std::string split_text;
};

/// Reads data.train_file, data.valid_file and training.replay.file
/// (their paths in `config` made absolute), splits, and audits the labels
/// of every file at once (issue 47). Warnings go to `err`.
/// @throws DataError / ConfigError naming the file or key.
RunData read_run_data(Config& config, std::ostream& err) {
  const auto& tc = config.training;
  RunData d;
  const std::string train_path = resolve_data_path(config.data.train_file, "data.train_file");
  d.train_path = train_path;
  config.data.train_file = train_path;
  std::vector<Structure> all = read_file(train_path, config.data, "data.train_file");
  LabelAudit label_audit;  // issue 47: labels under keys not named, every file in one message
  label_audit.add(train_path, all, extxyz_options(config.data));
  // data.e0s isolated: the isolated-atom frames give the E0s and are
  // neither trained nor validated on (issue 18).
  const bool isolated_e0s = config.data.e0s.mode == "isolated";
  if (isolated_e0s) d.isolated = take_isolated_atoms(all);
  if (config.data.e0s.mode == "least_squares") {  // issue 47: name the rule their frames are for
    const auto n_isolated = std::count_if(all.begin(), all.end(), is_isolated_atom);
    if (n_isolated > 0) {
      err << "crucible: warning: " << train_path << " holds " << n_isolated
          << " isolated-atom frame" << (n_isolated > 1 ? "s" : "")
          << " (config_type IsolatedAtom, or one atom with no periodic direction); data.e0s=isolated "
             "takes their energies as the E0s and leaves them out of training and validation (MACE's "
             "convention), while the default least_squares fits and validates them like any structure\n";
    }
  }
  if (config.data.valid_file) {
    const std::string valid_path = resolve_data_path(*config.data.valid_file, "data.valid_file");
    config.data.valid_file = valid_path;
    d.valid = read_file(valid_path, config.data, "data.valid_file");
    label_audit.add(valid_path, d.valid, extxyz_options(config.data));
    if (isolated_e0s) (void)take_isolated_atoms(d.valid);
    d.train = std::move(all);
    d.split_text = "validation file " + valid_path;
  } else {
    const int64_t n = static_cast<int64_t>(all.size());
    if (n < 2) {
      throw DataError(train_path + ": data.train_file must contain at least 2 structures to split "
                                   "off a validation set, got " + std::to_string(n) +
                      " (or set data.valid_file)");
    }
    auto [ti, vi] = random_split(n, config.data.valid_fraction,
                                 static_cast<uint64_t>(config.data.seed));
    if (ti.empty()) {
      throw ConfigError("data.valid_fraction leaves no training structures: must be smaller, got " +
                        fmt::format("{}", config.data.valid_fraction));
    }
    for (int64_t i : ti) d.train.push_back(all[i]);
    for (int64_t i : vi) d.valid.push_back(all[i]);
    d.split_text = fmt::format("valid_fraction {} of train_file, split seed {}",
                               config.data.valid_fraction, config.data.seed);
  }
  all.clear();
  // training.replay (issue 18): the pool of original structures.
  if (tc.replay.file) {
    const std::string replay_path = resolve_data_path(*tc.replay.file, "training.replay.file");
    config.training.replay.file = replay_path;
    d.replay = read_file(replay_path, config.data, "training.replay.file");
    label_audit.add(replay_path, d.replay, extxyz_options(config.data));
    if (isolated_e0s) (void)take_isolated_atoms(d.replay);
    if (d.replay.empty()) throw DataError(replay_path + ": training.replay.file holds no structure to replay");
    for (auto& s : d.replay) s.weight *= tc.replay.weight;
  }

  label_audit.throw_if_any();
  return d;
}

/// The loss of the run: the terms of `lc` with a positive weight whose
/// label the training data has (`tl`), with their schedules, config_type
/// weights and normalization; `text` describes it for the header. A
/// weighted term without labels is dropped with a warning on `err`.
/// @throws ConfigError when no term is left.
struct RunLoss {
  WeightedSumLoss loss;
  std::vector<std::string> terms;
  std::string text;
};

RunLoss build_run_loss(const LossSettings& lc, const LabelCounts& tl, const DataConfig& data, std::ostream& err) {
  RunLoss out;
  auto add_term = [&](const std::string& name, const std::string& desc) {
    auto schedule = loss_weight_schedule(lc, name);
    out.loss.add(loss_term(lc, name), schedule);
    out.terms.push_back(name);
    std::string w = fmt::format("{}", schedule->weight(0, 0));
    if (lc.schedule != "constant") {
      const double w_final = name == "energy"   ? lc.energy_weight_final
                             : name == "forces" ? lc.forces_weight_final
                                                : lc.stress_weight_final;
      w = fmt::format("({}→{}, {} over {}s {}..{})", w, w_final, lc.schedule, lc.schedule_clock,
                      lc.schedule_start,
                      lc.schedule == "step" ? lc.schedule_start : lc.schedule_end);
    }
    out.text += (out.text.empty() ? "" : " + ") + fmt::format("{}·{}", w, desc);
  };
  const std::string penalty =
      lc.kind == "mse" ? "MSE" : lc.kind == "mae" ? "MAE" : fmt::format("Huber(δ={})", lc.huber_delta);
  if (max_loss_weight(lc, "energy") > 0) {
    if (tl.energy > 0) {
      add_term("energy", penalty + (lc.energy_per_atom ? " energy(per atom)" : " energy"));
    } else {
      err << "crucible: warning: training.loss.energy_weight > 0 but no training structure has "
             "an energy ('" << data.energy_key << "'); energy term dropped\n";
    }
  }
  if (max_loss_weight(lc, "forces") > 0) {
    if (tl.forces > 0) {
      add_term("forces", penalty + (lc.forces_mode == "vector" ? " forces(per-atom norm)" : " forces"));
    } else {
      err << "crucible: warning: training.loss.forces_weight > 0 but no training structure has "
             "forces; forces term dropped\n";
    }
  }
  if (max_loss_weight(lc, "stress") > 0 && tl.stress > 0) add_term("stress", penalty + " stress");
  out.loss.set_normalize_weights(lc.normalize_weights);
  out.loss.set_config_type_weights(lc.config_type_weights);
  if (!lc.config_type_weights.empty()) {
    std::string types;
    for (const auto& [t, w] : lc.config_type_weights) types += fmt::format("{}{} {}", types.empty() ? "" : ", ", t, w);
    out.text += "; config_type weights " + types;
  }
  if (lc.normalize_weights) out.text += "; normalized by the weight sum";
  if (out.loss.empty()) {
    throw ConfigError("training.loss must have a weight > 0 for a label the training data has "
                      "(energy " + std::to_string(tl.energy) + ", forces " +
                      std::to_string(tl.forces) + ", stress " + std::to_string(tl.stress) +
                      " structures), got none");
  }
  return out;
}

}  // namespace

at::Device parse_device(const std::string& text) {
  at::Device device(at::kCPU);
  try {
    device = at::Device(text);
  } catch (const c10::Error&) {
    throw ConfigError("training.device must be cpu, cuda or cuda:N, got '" + text + "'");
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    throw ConfigError("training.device must be cpu on this build (LibTorch without CUDA), got '" +
                      text + "'");
  }
  return device;
}

ExtxyzOptions extxyz_options(const DataConfig& d) {
  ExtxyzOptions o;
  o.energy_key = d.energy_key;
  o.forces_key = d.forces_key;
  o.stress_key = d.stress_key;
  o.virial_key = d.virial_key;
  o.energy_unit = d.energy_unit.factor;
  o.forces_unit = d.forces_unit.factor;
  o.stress_unit = d.stress_unit.factor;
  o.memory_budget_bytes = static_cast<double>(available_memory_bytes());  // issue 47
  return o;
}

LabelCounts count_labels(const std::vector<Structure>& s) {
  LabelCounts c;
  for (const auto& x : s) {
    c.energy += x.energy.has_value();
    c.forces += x.forces.has_value();
    c.stress += x.stress.has_value();
    c.atoms += x.num_atoms();
  }
  return c;
}

ThreadChoice resolve_thread_count(int64_t num_threads, const at::Device& device, EnergyModel& model,
                                  const AtomicDataset& train, int64_t batch_size, at::ScalarType batch_dtype) {
  ThreadChoice choice;
  if (num_threads > 0) {
    choice.threads = static_cast<int>(num_threads);
    choice.source = "training.num_threads";
    return choice;
  }
  if (const auto omp = omp_num_threads_from_environment()) {
    at::set_num_threads(*omp);
    choice.threads = *omp;
    choice.source = "auto: OMP_NUM_THREADS";
    return choice;
  }
  const int cores = std::max(1, available_cpu_cores() / local_worker_count());
  if (!device.is_cpu() || cores == 1) {  // on a GPU the CPU threads only collate
    at::set_num_threads(cores);
    choice.threads = cores;
    choice.source = cores == 1 ? "auto: one core per worker" : "auto: this worker's cores";
    return choice;
  }
  std::vector<int64_t> first(static_cast<size_t>(std::min<int64_t>(batch_size, train.size())));
  for (size_t k = 0; k < first.size(); ++k) first[k] = static_cast<int64_t>(k);
  const Batch batch = train.collate(first).to(device, batch_dtype);
  ThreadChoiceOptions options;
  options.max_threads = cores;
  return choose_thread_count(training_pass(model, batch), options);
}

TrainingSetup build_training(const Config& input_config,
                             const std::vector<std::shared_ptr<Hook>>& hooks,
                             std::shared_ptr<Communicator> communicator, int local_rank) {
  std::ostringstream err;  // warnings, one per line
  Config config = input_config;
  validate_config(config);
  const auto& tc = config.training;
  at::Device device = parse_device(tc.device);
  // One GPU per worker: a bare "cuda" means this worker's local GPU.
  if (device.is_cuda() && !device.has_index() && communicator && communicator->size() > 1) {
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  }
  // training.precision (issue 3) overrides training.dtype; unset = follow it.
  const at::ScalarType dtype = run_dtype(tc);
  const std::string dtype_name = ::crucible::dtype_name(dtype);
  // Issue 19: bf16 on a CPU that emulates it is slower than 32-true; say so.
  if (tc.precision && tc.precision->rfind("bf16", 0) == 0 && device.is_cpu()) {
    const std::string flags = read_cpu_flags();
    if (!cpu_flags_have_native_bf16(flags)) {
      const auto [fp32, bf16] = measure_cpu_matmul_fp32_bf16();
      err << "crucible: warning: training.precision " << *tc.precision << ": " << cpu_bf16_note(flags, fp32, bf16) << "\n";
    }
  }
  // Issue 15: bounds checked from the key values before anything is allocated.
  check_thread_count(tc.num_threads);
  const int64_t available = available_memory_bytes();
  const int64_t process_bytes = resident_memory_bytes();  // before the data: the memory estimate's base
  check_model_size(config.model, available);
  if (tc.num_threads > 0) at::set_num_threads(static_cast<int>(tc.num_threads));
  // training.num_threads 0 (auto) is resolved below, once model and first batch exist.

  // ---- data: read and check everything before touching the run directory.
  RunData data = read_run_data(config, err);
  const std::string& train_path = data.train_path;
  std::vector<Structure>& train = data.train;
  std::vector<Structure>& valid = data.valid;
  std::vector<Structure>& replay = data.replay;
  std::vector<Structure>& isolated = data.isolated;
  std::string& split_text = data.split_text;
  const LabelCounts tl = count_labels(train);
  const LabelCounts vl = count_labels(valid);
  // Issue 18: a label with a positive loss weight must be in the data; the
  // message lists the file's keys and the MACE name that would match.
  // Batches per epoch as DataLoader::size() counts them (checked against the
  // loader below): stage two's default start with training.num_steps.
  const int64_t replay_per_epoch =
      replay.empty() ? 0
                     : std::clamp<int64_t>(static_cast<int64_t>(std::llround(
                                               tc.replay.fraction * static_cast<double>(train.size()))),
                                           1, static_cast<int64_t>(replay.size()));
  int64_t batches_per_epoch = 0;
  {
    const int64_t n = static_cast<int64_t>(train.size()) + replay_per_epoch;
    const int64_t r = communicator && communicator->size() > 1 ? communicator->size() : 1;
    const int64_t per_rank = (tc.distributed.drop_last && r > 1 && n % r != 0) ? n / r : (n + r - 1) / r;
    batches_per_epoch = (per_rank + tc.batch_size - 1) / tc.batch_size;
  }
  if (!tc.num_steps && tc.num_epochs && tc.gradient_accumulation_steps > batches_per_epoch * *tc.num_epochs) {
    throw ConfigError(fmt::format(  // issue 47: no optimizer step would ever be taken
        "training.gradient_accumulation_steps must be at most the {} batches of the run ({} per epoch x "
        "training.num_epochs {}), got {}; no optimizer step would be taken",
        batches_per_epoch * *tc.num_epochs, batches_per_epoch, *tc.num_epochs, tc.gradient_accumulation_steps));
  }
  std::optional<int64_t> run_epochs;
  if (tc.num_steps && batches_per_epoch > 0) {
    const int64_t batches = *tc.num_steps * tc.gradient_accumulation_steps;
    run_epochs = (batches + batches_per_epoch - 1) / batches_per_epoch;
  }
  const std::optional<int64_t> stage_two_start = stage_two_start_epoch(tc, run_epochs);
  const LossSettings effective_loss = effective_loss_settings(tc, run_epochs);  // with stage two
  const auto& lw = effective_loss;
  if (tl.energy == 0 && (max_loss_weight(lw, "energy") > 0 || tl.forces == 0)) {
    throw DataError(missing_label_message(train, train_path, LabelKind::kEnergy, config.data) +
                    (tl.forces > 0 ? "; or set training.loss.energy_weight=0 to train on forces only" : ""));
  }
  if (tl.forces == 0 && max_loss_weight(lw, "forces") > 0) {
    throw DataError(missing_label_message(train, train_path, LabelKind::kForces, config.data) +
                    "; or set training.loss.forces_weight=0 to train on energies only");
  }
  const std::set<int64_t> elements = elements_of({&train, &replay});
  const std::set<int64_t> valid_elements = elements_of({&valid});
  std::string unseen;
  for (int64_t z : valid_elements) {
    if (!elements.count(z)) unseen += " " + chemical_symbol(z);
  }
  if (!unseen.empty()) {
    err << "crucible: warning: validation structures contain elements absent from the training "
           "set:" << unseen << "; their predictions are meaningless\n";
  }

  // ---- loss terms: only those with a positive weight and labels.
  RunLoss run_loss = build_run_loss(effective_loss, tl, config.data, err);

  // ---- normalization from the training structures only.
  // The new structures, then the replay pool: the normalization sees both
  // (the replayed elements need E0s), and the loader draws from the pool
  // each epoch.
  std::vector<Structure> train_and_pool = train;
  train_and_pool.insert(train_and_pool.end(), replay.begin(), replay.end());
  // Fine-tuning (issues 18, 46): the source model, loaded first, keeps its
  // energy scale and shift (refitting them changes its predictions before
  // the first step) and may give the E0s (data.e0s foundation / estimated).
  std::optional<LoadedModel> source;
  if (config.model.init_from) source = load_init_from(*config.model.init_from, config.model.type);
  const std::string& e0_mode = config.data.e0s.mode;
  if ((e0_mode == "foundation" || e0_mode == "estimated") && !source) {
    throw ConfigError("data.e0s " + e0_mode + " takes the E0s of model.init_from, which is not set");
  }
  const E0Choice e0_choice = source && (e0_mode == "foundation" || e0_mode == "estimated")
                                 ? source_e0s(config.data.e0s, *source, train_and_pool, elements)
                                 : choose_e0s(config.data.e0s, train_and_pool, isolated, elements);
  if (!e0_choice.warning.empty()) err << "crucible: warning: " << e0_choice.warning << "\n";
  if (source && e0_mode != "foundation" && e0_mode != "estimated") {
    err << "crucible: warning: data.e0s " << e0_mode << " replaces the E0s of model.init_from, which shifts its "
        << "energies before the first step; data.e0s=foundation keeps them, data.e0s=estimated corrects them on "
        << "this data\n";
  }
  const at::Tensor e0 = e0_choice.e0;
  const auto [scale, shift] = source ? std::pair<double, double>{source->meta.scale, source->meta.shift}
                                     : fit_energy_scale_shift(train_and_pool, e0,
                                                              parse_energy_scaling(config.model.scaling),
                                                              config.model.shift == "mean");

  // ---- datasets, model, strategy (all may still reject the config).
  // An imported source brings its own architecture, cutoff included.
  const bool imported_source = source && is_imported_model(*source->model);
  const double cutoff = imported_source ? source->model->cutoff() : config.model.cutoff;
  check_neighbor_memory(train, cutoff, config.data.train_file, available);
  check_neighbor_memory(valid, cutoff,
                        config.data.valid_file ? *config.data.valid_file : config.data.train_file,
                        available);
  if (!replay.empty()) check_neighbor_memory(replay, cutoff, *config.training.replay.file, available);
  auto train_ds = std::make_shared<AtomicDataset>(train_and_pool, cutoff);
  train_and_pool.clear();
  auto valid_ds = std::make_shared<AtomicDataset>(valid, cutoff);

  at::manual_seed(static_cast<uint64_t>(tc.seed));
  // The registered model of model.type (issue 16), built from its keys.
  ModelBuildContext mctx;
  mctx.type = config.model.type;
  mctx.params = &config.model.params;
  mctx.cutoff = cutoff;
  mctx.elements.assign(elements.begin(), elements.end());
  // The training neighbor lists (not the replay pool's): the mean neighbor
  // count (MACE's avg_num_neighbors) and the closest pair (model.json's minimum).
  const NeighborStats stats = neighbor_stats(*train_ds, static_cast<int64_t>(train.size()));
  const double min_pair = stats.min_pair_distance;
  mctx.avg_num_neighbors = stats.avg_num_neighbors;
  {
    const bool could_have_pairs = std::any_of(train.begin(), train.end(),
                                              [](const Structure& s) { return s.num_atoms() > 1 || s.periodic(); });
    if (stats.edges == 0 && could_have_pairs) {  // issue 47: a model that sees no neighbor learns nothing
      throw ConfigError(fmt::format("{} {:g} Å leaves every atom of {} without a neighbor (no pair closer than the "
                                    "cutoff in {} structures); MLIP cutoffs are usually 4-6 Å",
                                    imported_source ? "the imported model's cutoff" : "model.cutoff", cutoff,
                                    config.data.train_file, train.size()));
    }
  }
  // Fine-tuning (issue 18): the source model's elements join the new data's
  // (so a model with a fixed element list keeps its shapes) and its
  // neighbor normalization is kept.
  std::vector<int64_t> new_elements;
  if (source) {
    std::set<int64_t> all_elements(source->meta.atomic_numbers.begin(), source->meta.atomic_numbers.end());
    for (int64_t z : elements) {
      if (!all_elements.count(z)) new_elements.push_back(z);
      all_elements.insert(z);
    }
    mctx.elements.assign(all_elements.begin(), all_elements.end());
    const auto& h = source->meta.hyperparameters;
    if (h.contains("avg_num_neighbors")) mctx.avg_num_neighbors = h.at("avg_num_neighbors").get<double>();
  }
  // Seed 004 module_init_context: parameters are created in the
  // precision's parameter dtype (the strategy then converts the rest).
  std::shared_ptr<EnergyModel> model = create_model(config.model.type, tc, [&] {
    return imported_source ? copy_of_imported_model(*source, config.model, ModelConfig{}, elements, *config.model.init_from)
                           : model_factory(config.model.type).create(mctx);
  });
  model->module().to(dtype);
  if (source && !imported_source) {  // in the run's dtype: a float64 run keeps the source's float64 weights exactly
    source->model->module().to(dtype);
    initialize_from(*model, *source->model, *config.model.init_from, new_elements);
    if (!new_elements.empty()) {
      err << "crucible: warning: model.init_from: elements new to the source model (" << element_symbols(new_elements)
          << ") start with untrained embeddings\n";
    }
  }
  model->set_energy_normalization(e0, scale, shift);
  int64_t num_params = 0;
  for (const auto& p : model->module().parameters()) num_params += p.numel();

  StrategyOptions sopt;
  sopt.num_epochs = tc.num_epochs;
  sopt.num_steps = tc.num_steps;
  sopt.optimizer = optimizer_config(tc);  // with its scheduler
  sopt.device = device;
  sopt.dtype = dtype;
  if (tc.precision) sopt.precision = *tc.precision;  // mixed modes: MixedPrecisionHook
  // num_epochs counts batches; with accumulation an optimizer step takes n of them.
  sopt.epoch_step_modifier = 1.0 / static_cast<double>(tc.gradient_accumulation_steps);
  sopt.max_batches_without_step = tc.max_batches_without_step;
  ValidationConfig vc;
  vc.data = valid_ds;
  vc.every_n_epochs = tc.validate_every_n_epochs;
  vc.every_n_steps = tc.validate_every_n_steps;
  vc.use_mixed_precision = parse_validation_precision(tc.validate_with_mixed_precision);
  vc.batch_size = tc.valid_batch_size;
  vc.use_ema = tc.ema.use_for_validation;
  sopt.validation = vc;

  DataLoaderOptions lo;
  lo.batch_size = tc.batch_size;
  lo.shuffle = true;
  lo.seed = static_cast<uint64_t>(tc.seed);
  if (!replay.empty()) {
    lo.replay_begin = static_cast<int64_t>(train.size());
    lo.replay_per_epoch = replay_per_epoch;
    split_text += fmt::format("; replays {} of the {} structures of {} per epoch (loss weight x{})",
                              lo.replay_per_epoch, replay.size(), *config.training.replay.file, tc.replay.weight);
  }
  if (communicator && communicator->size() > 1) {
    lo.num_replicas = communicator->size();
    lo.rank = communicator->rank();
    lo.sampler_drop_last = tc.distributed.drop_last;
    sopt.communicator = communicator;
    sopt.bucket_cap_mb = tc.distributed.bucket_cap_mb;
  }

  // Issue 47: the peak, estimated before the training state and the
  // activations are allocated, and refused when it does not fit.
  MemoryEstimate memory;
  {
    memory.process = static_cast<double>(process_bytes);
    int64_t frames = 0, atoms = 0;
    for (const auto* set : {&train, &valid, &replay, &isolated}) {
      frames += static_cast<int64_t>(set->size());
      for (const auto& st : *set) atoms += st.num_atoms();
    }
    memory.structures = structures_bytes(frames, atoms);
    auto extents = [](const AtomicDataset& ds, std::vector<int64_t>& edges, std::vector<int64_t>& natoms) {
      for (int64_t k = 0; k < static_cast<int64_t>(ds.size()); ++k) {
        edges.push_back(ds.neighbor_list(k).num_edges());
        natoms.push_back(ds.structures()[static_cast<size_t>(k)].num_atoms());
      }
    };
    std::vector<int64_t> train_edges, train_atoms, valid_edges, valid_atoms;
    extents(*train_ds, train_edges, train_atoms);
    extents(*valid_ds, valid_edges, valid_atoms);
    const double pairs = std::accumulate(train_edges.begin(), train_edges.end(), 0.0) +
                         std::accumulate(valid_edges.begin(), valid_edges.end(), 0.0);
    memory.neighbor_lists = kNeighborPairBytes * pairs;
    const double size = static_cast<double>(c10::elementSize(dtype));
    memory.state_copies = training_state_copies(tc.optimizer.name, tc.optimizer.amsgrad, tc.optimizer.momentum,
                                                tc.optimizer.centered, tc.ema.enabled);
    const auto& estimate_activations = model_factory(config.model.type).activation_estimate;
    if (!device.is_cpu()) {
      memory.not_counted = "the weights, optimizer and activations on " + device.str();
    } else {
      memory.training_state = size * memory.state_copies * static_cast<double>(num_params);
      if (imported_source || !estimate_activations) {
        memory.not_counted = "the activations of an imported model";
      } else {
        const ActivationEstimate a = estimate_activations(mctx);
        // The batches the run draws (their seeded shuffles), up to three epochs of them.
        DataLoader shuffled(train_ds, lo);
        const int64_t run_batches =
            tc.num_steps ? *tc.num_steps * tc.gradient_accumulation_steps
                         : shuffled.size() * std::min<int64_t>(3, tc.num_epochs.value_or(3));
        std::vector<std::vector<int64_t>> train_batches, valid_batches;
        for (int64_t epoch = 0; epoch < 3 && static_cast<int64_t>(train_batches.size()) < run_batches; ++epoch) {
          shuffled.set_epoch(epoch);
          for (int64_t k = 0; k < shuffled.size() && static_cast<int64_t>(train_batches.size()) < run_batches; ++k)
            train_batches.push_back(shuffled.batch_indices(k));
        }
        for (int64_t i = 0; i < static_cast<int64_t>(valid_edges.size()); i += tc.valid_batch_size) {
          valid_batches.emplace_back();
          for (int64_t j = i; j < std::min<int64_t>(i + tc.valid_batch_size, valid_edges.size()); ++j)
            valid_batches.back().push_back(j);
        }
        memory.activations =
            std::max(largest_batch_activations(a, 1.0, size, train_edges, train_atoms, train_batches),
                     largest_batch_activations(a, a.eval_fraction, size, valid_edges, valid_atoms, valid_batches));
      }
    }
    check_training_memory(memory, available, config.model.type);
  }

  auto strategy = std::make_unique<TrainingStrategy>(model, sopt, std::move(run_loss.loss));
  const ThreadChoice threads = resolve_thread_count(tc.num_threads, device, *model, *train_ds, tc.batch_size,
                                                    strategy->batch_dtype());
  if (!tc.freeze.empty()) {  // through the strategy's parameter filters (seed 002)
    const std::set<std::string> trainable = trainable_parameters(*model, tc.freeze);
    strategy->set_trainable_parameter_filter(trainable);
    strategy->set_optimizer_parameter_filter(trainable);
  }
  // Canonical update hooks (seed 001), folded into one orchestrator.
  if (tc.gradient_accumulation_steps > 1) {
    strategy->register_hook(
        std::make_shared<GradientAccumulationHook>(tc.gradient_accumulation_steps));
  }
  if (tc.clip_grad_norm > 0) {
    GradientClippingOptions clip;
    clip.max_norm = tc.clip_grad_norm;
    strategy->register_hook(std::make_shared<GradientClippingHook>(clip));
  }
  std::shared_ptr<SpikeSkippingHook> spike_hook;
  if (tc.spike_skipping.enabled) {
    SpikeSkippingOptions so_spike;
    so_spike.k = tc.spike_skipping.k;
    so_spike.window = tc.spike_skipping.window;
    so_spike.min_history = tc.spike_skipping.min_history;
    spike_hook = std::make_shared<SpikeSkippingHook>(so_spike);
    strategy->register_hook(spike_hook);
  }
  std::shared_ptr<EmaHook> ema_hook;
  if (tc.ema.enabled) {
    ema_hook = std::make_shared<EmaHook>(
        EmaOptions{tc.ema.decay, tc.ema.update_every, tc.ema.start_step, tc.ema.warmup});
    strategy->register_hook(ema_hook);
  }
  if (stage_two_start) {
    strategy->register_hook(std::make_shared<StageTwoHook>(StageTwoOptions{*stage_two_start, tc.stage_two.lr}));
  }
  // The best validation's weights (model.pt) and early stopping.
  auto best_hook = std::make_shared<BestModelHook>(
      BestModelOptions{tc.early_stopping.monitor, tc.early_stopping.patience, stage_two_start});
  strategy->register_hook(best_hook);
  for (const auto& h : hooks) strategy->register_hook(h);

  TrainingSetup s;
  s.device = device;
  s.dtype = dtype;
  s.train = std::move(train);
  s.valid = std::move(valid);
  s.split_text = std::move(split_text);
  s.train_labels = tl;
  s.min_pair_distance = min_pair;
  s.valid_labels = vl;
  s.elements = std::move(elements);
  std::istringstream lines(err.str());
  const std::string prefix = "crucible: warning: ";
  for (std::string line; std::getline(lines, line);) {
    s.warnings.push_back(line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : line);
  }
  s.e0 = e0;
  s.e0_source = e0_choice.source;
  if (source && source->meta.origin.is_object()) {
    s.origin = source->meta.origin;
    s.origin["fine_tuned_from"] = *config.model.init_from;
  }
  s.scale = scale;
  s.shift = shift;
  s.model = model;
  s.num_parameters = num_params;
  s.memory = memory;
  s.memory_available = available;
  s.threads = threads;
  s.loss_terms = std::move(run_loss.terms);
  s.loss_text = std::move(run_loss.text);
  s.train_data = train_ds;
  s.valid_data = valid_ds;
  s.loader = std::make_unique<DataLoader>(train_ds, lo);
  if (s.loader->size() != batches_per_epoch) {
    throw std::logic_error("build_training: batches per epoch " + std::to_string(batches_per_epoch) +
                           " must be the loader's " + std::to_string(s.loader->size()));
  }
  s.stage_two_start = stage_two_start;
  s.strategy = std::move(strategy);
  s.spike_hook = spike_hook;
  s.ema_hook = ema_hook;
  s.best_hook = best_hook;
  s.config = std::move(config);
  return s;
}

namespace {

/// {"cpu_threads": N} with N >= 1. @throws DataError naming `source`.
int parse_thread_count(const std::string& text, const std::string& source) {
  try {
    const int n = nlohmann::json::parse(text).at("cpu_threads").get<int>();
    if (n >= 1) return n;
  } catch (const nlohmann::json::exception&) {
  }
  throw DataError(source + ": must be {\"cpu_threads\": N} with N >= 1, got " + text.substr(0, 80));
}

}  // namespace

std::optional<int> checkpoint_thread_count(const checkpoint::CheckpointStore& store, int64_t index) {
  std::string text;
  try {
    text = store.load_file(index, kThreadsFile);
  } catch (const DataError&) {
    return std::nullopt;  // written before the file existed
  }
  return parse_thread_count(text, "checkpoint " + std::to_string(index) + " " + kThreadsFile);
}

CheckpointValidator same_recipe_validator(const Config& config) {
  return [config](const LoadedCheckpoint& loaded) {
    const std::string file = "checkpoint " + std::to_string(loaded.entry.index) + " " + kRecipeFile;
    auto it = loaded.files.find(kRecipeFile);
    if (it == loaded.files.end()) {
      throw ConfigError(file + ": the checkpoint must contain the run's recipe, got no such file");
    }
    const auto diffs = recipe_differences(config_from_spec_json(it->second, file), config);
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      throw ConfigError(file + ": the recipe must match this run's, got differences:" + list);
    }
  };
}

TrainingSetup load_training_from_checkpoint(const std::filesystem::path& checkpoint_dir,
                                            const TrainingRuntime& runtime,
                                            std::optional<int64_t> index,
                                            RestoredCheckpoint* restored) {
  const checkpoint::CheckpointStore store(checkpoint_dir);
  RestoredCheckpoint info;
  const LoadedCheckpoint loaded = load_checkpoint(store, index, &info.skipped);
  info.index = loaded.entry.index;
  auto it = loaded.files.find(kRecipeFile);
  if (it == loaded.files.end()) {
    throw DataError((checkpoint_dir / loaded.entry.dir / kRecipeFile).string() +
                    ": a checkpoint to load a run from must contain its recipe, got no such file");
  }
  Config config = config_from_spec_json(
      it->second, (checkpoint_dir / loaded.entry.dir / kRecipeFile).string());
  if (runtime.device) config.training.device = *runtime.device;
  // An auto thread count takes the checkpoint's, so the run continues exactly.
  std::optional<int> saved_threads;
  if (auto t = loaded.files.find(kThreadsFile); t != loaded.files.end() && config.training.num_threads == 0) {
    saved_threads = parse_thread_count(t->second, (checkpoint_dir / loaded.entry.dir / kThreadsFile).string());
    config.training.num_threads = *saved_threads;
  }
  TrainingSetup setup =
      build_training(config, runtime.hooks, runtime.communicator, runtime.local_rank);
  if (saved_threads) {
    setup.config.training.num_threads = 0;
    setup.threads.source = "auto, as the checkpoint was written with";
  }
  same_models_validator(*setup.strategy)(loaded);
  for (const auto& validate : runtime.validators) {
    if (validate) validate(loaded);
  }
  setup.strategy->restore_state_files(loaded.files);
  if (restored) *restored = std::move(info);
  return setup;
}

}  // namespace crucible
