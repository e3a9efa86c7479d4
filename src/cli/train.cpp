// `crucible train`: config + data in, run directory out.

#include "crucible/cli/commands.h"
#include "crucible/cli/model_io.h"
#include "crucible/cli/learning_curve.h"
#include "crucible/cli/metrics_log.h"
#include "crucible/cli/progress.h"
#include "crucible/common/error.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/losses/loss.h"
#include "crucible/models/schnet.h"
#include "crucible/training/checkpointing.h"
#include "crucible/training/ema.h"
#include "crucible/training/gradient_accumulation.h"
#include "crucible/training/gradient_clipping.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace crucible {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

ExtxyzOptions extxyz_options(const DataConfig& d) {
  ExtxyzOptions o;
  o.energy_key = d.energy_key;
  o.forces_key = d.forces_key;
  o.stress_key = d.stress_key;
  o.virial_key = d.virial_key;
  o.energy_unit = d.energy_unit.factor;
  o.forces_unit = d.forces_unit.factor;
  o.stress_unit = d.stress_unit.factor;
  return o;
}

std::vector<Structure> read_file(const std::string& path, const DataConfig& d,
                                 const std::string& key) {
  std::vector<Structure> s = read_extxyz(path, extxyz_options(d));
  if (s.empty()) {
    throw DataError(path + ": " + key + " must contain at least one structure, got none");
  }
  return s;
}

struct LabelCounts {
  int64_t energy = 0, forces = 0, stress = 0, atoms = 0;
};

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

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

/// The run directory to use; refuses finished or non-empty ones unless overwrite.
fs::path choose_run_dir(const OutputConfig& o) {
  if (!o.run_dir) {
    const fs::path base = fs::path("runs") / timestamp();
    fs::path p = base;
    for (int i = 2; fs::exists(p); ++i) p = base.string() + "-" + std::to_string(i);
    return p;
  }
  const fs::path p(*o.run_dir);
  if (!fs::exists(p)) return p;
  if (!fs::is_directory(p)) {
    throw ConfigError("output.run_dir must be a directory, got '" + p.string() +
                      "', which is an existing file");
  }
  if (o.overwrite) return p;
  if (fs::exists(p / "summary.json")) {
    throw ConfigError("output.run_dir '" + p.string() +
                      "' holds a finished run (summary.json exists); choose another "
                      "output.run_dir or set output.overwrite=true to replace it");
  }
  if (!fs::is_empty(p)) {
    throw ConfigError("output.run_dir '" + p.string() +
                      "' exists and is not empty (an unfinished run?); choose another "
                      "output.run_dir or set output.overwrite=true");
  }
  return p;
}

void prepare_run_dir(const fs::path& p) {
  std::error_code ec;
  // summary.json first: from now on the directory must not look finished.
  for (const char* f : {"summary.json", "model.pt", "model.json", "metrics.csv", "metrics.jsonl",
                        "learning_curve.svg", "config.yaml"}) {
    fs::remove(p / f, ec);
    if (ec) throw DataError((p / f).string() + ": cannot remove old file (" + ec.message() + ")");
  }
  fs::create_directories(p, ec);
  if (ec) throw DataError(p.string() + ": run directory cannot be created (" + ec.message() + ")");
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw DataError(tmp.string() + ": cannot be created");
    out << text;
    out.flush();
    if (!out) throw DataError(tmp.string() + ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw DataError(path.string() + ": cannot be written (" + ec.message() + ")");
}

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

json metrics_json(const ErrorMetrics& v) {
  json j;
  for (const auto& [k, val] : v.as_map()) j[k] = std::isfinite(val) ? json(val) : json();
  const double ratio = v.forces_mae / v.zero_forces_mae;
  j["forces_mae_over_zero_forces_mae"] = std::isfinite(ratio) ? json(ratio) : json();
  j["num_structures"] = v.num_structures;
  j["num_energies"] = v.num_energies;
  j["num_forces"] = v.num_forces;
  j["num_stresses"] = v.num_stresses;
  return j;
}

json summary_json(const ValidationSummary& v) {
  json j = metrics_json(v);
  j["per_config_type"] = json::object();
  for (const auto& [type, m] : v.per_config_type) j["per_config_type"][type] = metrics_json(m);
  j["inference_model"] = v.inference_model;
  return j;
}

std::string format_metric(double v, int64_t count, const char* unit, int precision = 2) {
  if (count == 0 || !std::isfinite(v)) return "n/a";
  return fmt::format("{:.{}f} {}", v, precision, unit);
}

}  // namespace

std::string resolve_data_path(const std::string& path, const std::string& key) {
  const fs::path p(path);
  std::vector<std::string> tried;
  if (fs::exists(p)) return fs::absolute(p).lexically_normal().string();
  tried.push_back(fs::absolute(p).lexically_normal().string());
#ifdef CRUCIBLE_DATA_DIR
  if (p.is_relative()) {
    auto it = p.begin();
    if (it != p.end() && it->string() == "data") {
      fs::path alt(CRUCIBLE_DATA_DIR);
      for (++it; it != p.end(); ++it) alt /= *it;
      if (fs::exists(alt)) return alt.lexically_normal().string();
      tried.push_back(alt.lexically_normal().string());
    }
  }
#endif
  std::string where;
  for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
  throw DataError(key + " file '" + path + "' does not exist (looked in: " + where + ")");
}

TrainResult run_training(const Config& input_config, std::ostream& out, std::ostream& err,
                         const std::string& command_line, const ResumeOptions& resume) {
  const auto t0 = std::chrono::steady_clock::now();
  Config config = input_config;
  validate_config(config);
  const auto& tc = config.training;
  const at::Device device = parse_device(tc.device);
  // training.precision (issue 3) overrides training.dtype; unset = follow it.
  const at::ScalarType dtype =
      tc.precision ? (*tc.precision == "64-true" ? at::kDouble : at::kFloat)
                   : (tc.dtype == "float64" ? at::kDouble : at::kFloat);
  const std::string dtype_name = dtype == at::kDouble ? "float64" : "float32";
  if (tc.num_threads > 0) at::set_num_threads(static_cast<int>(tc.num_threads));

  // ---- data: read and check everything before touching the run directory.
  const std::string train_path = resolve_data_path(config.data.train_file, "data.train_file");
  config.data.train_file = train_path;
  std::vector<Structure> all = read_file(train_path, config.data, "data.train_file");
  std::vector<Structure> train, valid;
  std::string split_text;
  if (config.data.valid_file) {
    const std::string valid_path = resolve_data_path(*config.data.valid_file, "data.valid_file");
    config.data.valid_file = valid_path;
    valid = read_file(valid_path, config.data, "data.valid_file");
    train = std::move(all);
    split_text = "validation file " + valid_path;
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
    for (int64_t i : ti) train.push_back(all[i]);
    for (int64_t i : vi) valid.push_back(all[i]);
    split_text = fmt::format("valid_fraction {} of train_file, split seed {}",
                             config.data.valid_fraction, config.data.seed);
  }
  all.clear();

  const LabelCounts tl = count_labels(train);
  const LabelCounts vl = count_labels(valid);
  if (tl.energy == 0 && tl.forces == 0) {
    throw DataError(train_path + ": training structures must have energy ('" +
                    config.data.energy_key + "') or forces labels, got neither (check "
                    "data.energy_key / data.forces_key)");
  }
  std::set<int64_t> elements, valid_elements;
  for (const auto& s : train) {
    auto z = s.atomic_numbers.contiguous();
    for (int64_t i = 0; i < z.numel(); ++i) elements.insert(z.data_ptr<int64_t>()[i]);
  }
  for (const auto& s : valid) {
    auto z = s.atomic_numbers.contiguous();
    for (int64_t i = 0; i < z.numel(); ++i) valid_elements.insert(z.data_ptr<int64_t>()[i]);
  }
  std::string unseen;
  for (int64_t z : valid_elements) {
    if (!elements.count(z)) unseen += " " + chemical_symbol(z);
  }
  if (!unseen.empty()) {
    err << "crucible: warning: validation structures contain elements absent from the training "
           "set:" << unseen << "; their predictions are meaningless\n";
  }

  // ---- loss terms: only those with a positive weight and labels.
  const auto& lc = tc.loss;
  WeightedSumLoss loss;
  std::vector<std::string> terms;
  std::string loss_text;
  auto add_term = [&](const std::string& name, const std::string& desc) {
    auto schedule = loss_weight_schedule(lc, name);
    loss.add(loss_term(lc, name), schedule);
    terms.push_back(name);
    std::string w = fmt::format("{}", schedule->weight(0, 0));
    if (lc.schedule != "constant") {
      const double w_final = name == "energy"   ? lc.energy_weight_final
                             : name == "forces" ? lc.forces_weight_final
                                                : lc.stress_weight_final;
      w = fmt::format("({}→{}, {} over {}s {}..{})", w, w_final, lc.schedule, lc.schedule_clock,
                      lc.schedule_start,
                      lc.schedule == "step" ? lc.schedule_start : lc.schedule_end);
    }
    loss_text += (loss_text.empty() ? "" : " + ") + fmt::format("{}·{}", w, desc);
  };
  const std::string penalty =
      lc.kind == "mse" ? "MSE" : lc.kind == "mae" ? "MAE" : fmt::format("Huber(δ={})", lc.huber_delta);
  if (max_loss_weight(lc, "energy") > 0) {
    if (tl.energy > 0) {
      add_term("energy", penalty + (lc.energy_per_atom ? " energy(per atom)" : " energy"));
    } else {
      err << "crucible: warning: training.loss.energy_weight > 0 but no training structure has "
             "an energy ('" << config.data.energy_key << "'); energy term dropped\n";
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
  loss.set_normalize_weights(lc.normalize_weights);
  loss.set_config_type_weights(lc.config_type_weights);
  if (!lc.config_type_weights.empty()) {
    std::string types;
    for (const auto& [t, w] : lc.config_type_weights) types += fmt::format("{}{} {}", types.empty() ? "" : ", ", t, w);
    loss_text += "; config_type weights " + types;
  }
  if (lc.normalize_weights) loss_text += "; normalized by the weight sum";
  if (loss.empty()) {
    throw ConfigError("training.loss must have a weight > 0 for a label the training data has "
                      "(energy " + std::to_string(tl.energy) + ", forces " +
                      std::to_string(tl.forces) + ", stress " + std::to_string(tl.stress) +
                      " structures), got none");
  }

  // ---- normalization from the training structures only.
  at::Tensor e0 = at::zeros({119}, at::kDouble);
  if (tl.energy > 0) e0 = fit_reference_energies(train, 118);
  const auto [scale, shift] = fit_energy_scale_shift(train, e0);

  // ---- datasets, model, strategy (all may still reject the config).
  const double cutoff = config.model.cutoff;
  auto train_ds = std::make_shared<AtomicDataset>(train, cutoff);
  auto valid_ds = std::make_shared<AtomicDataset>(valid, cutoff);

  at::manual_seed(static_cast<uint64_t>(tc.seed));
  const SchNetOptions so = schnet_options(config.model);
  SchNet model(nullptr);
  try {
    model = SchNet(so);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("model: ") + e.what());
  }
  model->to(dtype);
  model->set_energy_normalization(e0, scale, shift);
  int64_t num_params = 0;
  for (const auto& p : model->parameters()) num_params += p.numel();

  StrategyOptions sopt;
  sopt.num_epochs = tc.num_epochs;
  sopt.num_steps = tc.num_steps;
  sopt.optimizer = optimizer_config(tc);  // with its scheduler
  sopt.device = device;
  sopt.dtype = dtype;
  if (tc.precision) sopt.precision = *tc.precision;  // mixed modes: MixedPrecisionHook
  // num_epochs counts batches; with accumulation an optimizer step takes n of them.
  sopt.epoch_step_modifier = 1.0 / static_cast<double>(tc.gradient_accumulation_steps);
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
  DataLoader loader(train_ds, lo);

  fs::path run_dir;
  if (resume.resume) {
    if (!config.output.run_dir) throw ConfigError("--resume needs a run directory, got none");
    run_dir = *config.output.run_dir;
    if (!fs::exists(run_dir / "config.yaml") || !fs::exists(run_dir / "checkpoints")) {
      throw ConfigError("--resume " + run_dir.string() + ": must be a run directory with "
                        "config.yaml and checkpoints/, got neither or only one");
    }
    if (fs::exists(run_dir / "summary.json")) {
      throw ConfigError("--resume " + run_dir.string() + ": the run finished (summary.json "
                        "exists); nothing to resume");
    }
    const auto diffs = recipe_differences(load_config_file((run_dir / "config.yaml").string()),
                                          config);
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      throw ConfigError("--resume " + run_dir.string() + ": the recipe must match the "
                        "checkpointed run's, got differences:" + list);
    }
  } else {
    run_dir = choose_run_dir(config.output);
  }
  config.output.run_dir = run_dir.string();

  // On a terminal a live bar per epoch (before the epoch lines it must not cut).
  ProgressBarOptions bar_options;
  bar_options.tty = (&out == &std::cout) && stdout_is_terminal();
  auto bar = std::make_shared<ProgressBarHook>(out, loader.size(), tc.num_epochs.value_or(0),
                                               bar_options);
  auto progress = std::make_shared<ProgressHook>(out, tc.num_epochs.value_or(0));
  MetricsJsonlOptions jsonl_options;
  jsonl_options.log_every_n_steps = config.output.log_every_n_steps;
  jsonl_options.learning_curve_path = (run_dir / "learning_curve.svg").string();
  jsonl_options.append = resume.resume;
  auto jsonl = std::make_shared<MetricsJsonlHook>((run_dir / "metrics.jsonl").string(),
                                                  jsonl_options);
  auto csv = std::make_shared<MetricsCsvHook>((run_dir / "metrics.csv").string(), terms,
                                              /*append=*/resume.resume);
  TrainingStrategy strategy(model.ptr(), sopt, std::move(loss), {bar, progress, csv, jsonl});
  const int64_t target_steps = strategy.target_step_count(loader.size());
  // Canonical update hooks (seed 001), folded into one orchestrator.
  if (tc.gradient_accumulation_steps > 1) {
    strategy.register_hook(
        std::make_shared<GradientAccumulationHook>(tc.gradient_accumulation_steps));
  }
  if (tc.clip_grad_norm > 0) {
    GradientClippingOptions clip;
    clip.max_norm = tc.clip_grad_norm;
    strategy.register_hook(std::make_shared<GradientClippingHook>(clip));
  }
  std::shared_ptr<SpikeSkippingHook> spike_hook;
  if (tc.spike_skipping.enabled) {
    SpikeSkippingOptions so_spike;
    so_spike.k = tc.spike_skipping.k;
    so_spike.window = tc.spike_skipping.window;
    so_spike.min_history = tc.spike_skipping.min_history;
    spike_hook = std::make_shared<SpikeSkippingHook>(so_spike);
    strategy.register_hook(spike_hook);
  }
  std::shared_ptr<EmaHook> ema_hook;
  if (tc.ema.enabled) {
    ema_hook = std::make_shared<EmaHook>(
        EmaOptions{tc.ema.decay, tc.ema.update_every, tc.ema.start_step});
    strategy.register_hook(ema_hook);
  }
  std::string schedule_text;
  {
    const auto& sc = tc.scheduler;
    const std::string warm =
        sc.warmup_steps > 0 && sc.name != "plateau"
            ? fmt::format(" after {} warmup steps from {}", sc.warmup_steps,
                          tc.optimizer.lr * sc.warmup_start_factor)
            : "";
    if (sc.name == "cosine") {
      schedule_text = fmt::format("cosine lr {} → {}{}", tc.optimizer.lr,
                                  tc.optimizer.lr * sc.final_lr_factor, warm);
    } else if (sc.name == "step") {
      schedule_text = fmt::format("step lr ×{} every {} steps{}", sc.gamma, sc.step_size, warm);
    } else if (sc.name == "exponential") {
      schedule_text = fmt::format("exponential lr ×{} per step{}", sc.gamma, warm);
    } else if (sc.name == "plateau") {
      schedule_text = fmt::format("plateau lr ×{} after {} validations without {} improving",
                                  sc.factor, sc.patience, sc.monitor);
    } else {
      schedule_text = "constant lr" + warm;
    }
  }

  // ---- header.
  std::string elem_text, e0_text;
  for (int64_t z : elements) {
    elem_text += (elem_text.empty() ? "" : " ") + chemical_symbol(z);
    e0_text += fmt::format("{}{} {:.6f}", e0_text.empty() ? "" : ", ", chemical_symbol(z),
                           e0[z].item<double>());
  }
  out << "crucible train\n";
  out << fmt::format("  data       {} ({})\n", train_path, split_text);
  out << fmt::format("  train      {} structures, {} atoms (energy {}, forces {}, stress {})\n",
                     train.size(), tl.atoms, tl.energy, tl.forces, tl.stress);
  out << fmt::format("  validation {} structures, {} atoms (energy {}, forces {}, stress {})\n",
                     valid.size(), vl.atoms, vl.energy, vl.forces, vl.stress);
  out << fmt::format("  units      energy {}, forces {}, stress {} (converted to eV, eV/Å, eV/Å³)\n",
                     config.data.energy_unit.to_string(), config.data.forces_unit.to_string(),
                     config.data.stress_unit.to_string());
  out << fmt::format("  elements   {}\n", elem_text);
  out << fmt::format("  E0 (eV)    {}\n", e0_text);
  out << fmt::format("  scale      {:.6g} eV, shift {:.6g} eV/atom\n", scale, shift);
  out << fmt::format(
      "  model      {}: hidden_channels {}, num_filters {}, num_interactions {}, "
      "num_gaussians {}, cutoff {} Å; {} parameters\n",
      config.model.type, so.hidden_channels, so.num_filters, so.num_interactions,
      so.num_gaussians, so.cutoff, num_params);
  out << fmt::format("  loss       {}\n", loss_text);
  out << fmt::format("  optimizer  {} lr {} weight_decay {}; {}; {}\n", tc.optimizer.name,
                     tc.optimizer.lr, tc.optimizer.weight_decay, schedule_text,
                     tc.clip_grad_norm > 0 ? fmt::format("clip_grad_norm {}", tc.clip_grad_norm)
                                           : std::string("no gradient clipping"));
  out << fmt::format("  schedule   {} steps ({} batches/epoch, batch_size {}{}{})\n", target_steps,
                     loader.size(), tc.batch_size,
                     tc.gradient_accumulation_steps > 1
                         ? fmt::format(", {} batches/step", tc.gradient_accumulation_steps)
                         : "",
                     tc.num_epochs ? fmt::format(", {} epochs", *tc.num_epochs) : "");
  if (spike_hook || ema_hook) {
    std::string extras;
    if (spike_hook) {
      extras += fmt::format("spike skipping k {} window {} min_history {}", tc.spike_skipping.k,
                            tc.spike_skipping.window, tc.spike_skipping.min_history);
    }
    if (ema_hook) {
      extras += fmt::format("{}EMA decay {} every {} from step {}{}", extras.empty() ? "" : "; ",
                            tc.ema.decay, tc.ema.update_every, tc.ema.start_step,
                            tc.ema.use_for_validation ? " (validation and model.pt use it)" : "");
    }
    out << fmt::format("  updates    {}\n", extras);
  }
  out << fmt::format("  device     {}, {}, CPU threads: {}\n", device.str(),
                     tc.precision ? dtype_name + ", precision " + *tc.precision : tc.dtype,
                     at::get_num_threads());
  out << fmt::format("  run_dir    {}\n", run_dir.string());
  out.flush();

  // ---- checkpoints: cadence, end of training, SIGINT/SIGTERM.
  checkpoint::RetentionPolicy retention;
  retention.keep_last = static_cast<size_t>(config.output.keep_last_checkpoints);
  retention.keep_best_by = "forces_mae";
  CheckpointHookOptions ckpt_options;
  ckpt_options.every_n_steps = config.output.checkpoint_every_n_steps;
  ckpt_options.every_n_epochs = config.output.checkpoint_every_n_epochs;
  std::shared_ptr<checkpoint::CheckpointStore> store;
  std::shared_ptr<CheckpointHook> ckpt_hook;

  // ---- run directory: config first, summary last.
  if (resume.resume) {
    store = std::make_shared<checkpoint::CheckpointStore>(run_dir / "checkpoints", retention);
    ckpt_hook = std::make_shared<CheckpointHook>(store, ckpt_options);
    strategy.register_hook(ckpt_hook);
    const auto restored = restore_checkpoint(*store, strategy, resume.checkpoint);
    for (const auto& f : restored.skipped) {
      err << "crucible: warning: checkpoint " << f.index << " is damaged (" << f.message
          << "); using an older one\n";
    }
    out << fmt::format("resuming from checkpoint {} (step {}, epoch {}, batch {} of the epoch)\n",
                       restored.index, strategy.step_count, strategy.epoch_count,
                       strategy.epoch_step_count);
  } else {
    prepare_run_dir(run_dir);
    std::string header = "# Resolved configuration of this run (every key).\n";
    if (!command_line.empty()) header += "# Command: " + command_line + "\n";
    write_file_atomically(run_dir / "config.yaml", header + dump_config(config, false));
    std::error_code ec;
    fs::remove_all(run_dir / "checkpoints", ec);  // an overwritten run's
    store = std::make_shared<checkpoint::CheckpointStore>(run_dir / "checkpoints", retention);
    ckpt_hook = std::make_shared<CheckpointHook>(store, ckpt_options);
    strategy.register_hook(ckpt_hook);
  }

  // Fault injection for the end-to-end tests: a real SIGTERM after batch N.
  if (const char* at = std::getenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH")) {
    const int64_t n = std::atoll(at);
    strategy.register_hook(std::make_shared<LambdaHook>(
        "fault injection", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
        [n](TrainContext& ctx, TrainingStage) {
          if (ctx.batch_count == n) std::raise(SIGTERM);
        }));
  }
  strategy.run(loader);
  if (ckpt_hook->signal_received()) {
    out << fmt::format("stopped by a signal after step {} (epoch {}); checkpoint written to {}\n"
                       "resume with: crucible train --resume {}\n",
                       strategy.step_count, strategy.epoch_count, (run_dir / "checkpoints").string(),
                       run_dir.string());
    out.flush();
    TrainResult stopped;
    stopped.run_dir = run_dir.string();
    stopped.steps = strategy.step_count;
    stopped.epochs = strategy.epoch_count;
    stopped.stopped = true;
    return stopped;
  }
  if (!jsonl->curve_error().empty()) {
    err << "crucible: warning: " << jsonl->curve_error() << "\n";
  }
  ValidationSummary final_metrics =
      strategy.last_validation() ? *strategy.last_validation() : strategy.validate();

  ModelMetadata meta;
  meta.model_type = config.model.type;
  meta.options = so;
  meta.dtype = dtype_name;
  meta.atomic_numbers.assign(elements.begin(), elements.end());
  for (int64_t z : elements) meta.e0[z] = e0[z].item<double>();
  meta.scale = scale;
  meta.shift = shift;
  meta.data = config.data;
  // With EMA for validation, model.pt holds the averaged weights (MACE).
  auto inference = tc.ema.use_for_validation ? strategy.inference_model() : nullptr;
  if (inference) {
    SchNet averaged(std::dynamic_pointer_cast<SchNetImpl>(inference));
    save_model(run_dir.string(), averaged, meta);
  } else {
    save_model(run_dir.string(), model, meta);
  }

  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double final_loss = std::nan("");
  if (!progress->records().empty()) final_loss = progress->records().back().train_loss;

  json summary;
  summary["finished"] = true;
  summary["run_dir"] = run_dir.string();
  summary["wall_time_s"] = wall;
  summary["epochs_completed"] = strategy.epoch_count;
  summary["steps"] = strategy.step_count;
  if (tc.precision) summary["precision"] = *tc.precision;
  if (strategy.precision_hook() && strategy.precision_hook()->scaler()) {
    summary["grad_scale"] = strategy.precision_hook()->scale();  // final 16-mixed loss scale
  }
  summary["skipped_steps"] = spike_hook ? spike_hook->skipped_steps() : 0;
  if (ema_hook) summary["ema_updates"] = ema_hook->num_updates();
  summary["model_weights"] = inference ? "ema" : "live";
  summary["train_structures"] = train.size();
  summary["valid_structures"] = valid.size();
  summary["final_train_loss"] = std::isfinite(final_loss) ? json(final_loss) : json();
  summary["validation"] = summary_json(final_metrics);
  summary["units"] = {{"energy_mae", "meV/atom"},  {"energy_rmse", "meV/atom"},
                      {"forces_mae", "meV/Å"},     {"forces_rmse", "meV/Å"},
                      {"stress_mae", "meV/Å^3"},   {"stress_rmse", "meV/Å^3"},
                      {"zero_forces_mae", "meV/Å"}, {"wall_time_s", "s"}};
  write_file_atomically(run_dir / "summary.json", summary.dump(2) + "\n");

  const auto& v = final_metrics;
  out << "final validation (" << v.num_structures << " structures)\n";
  out << fmt::format("  energy  MAE {:>16}   RMSE {:>16}\n",
                     format_metric(v.energy_mae, v.num_energies, "meV/atom"),
                     format_metric(v.energy_rmse, v.num_energies, "meV/atom"));
  out << fmt::format("  forces  MAE {:>16}   RMSE {:>16}\n",
                     format_metric(v.forces_mae, v.num_forces, "meV/Å"),
                     format_metric(v.forces_rmse, v.num_forces, "meV/Å"));
  if (v.num_stresses > 0) {
    out << fmt::format("  stress  MAE {:>16}   RMSE {:>16}\n",
                       format_metric(v.stress_mae, v.num_stresses, "meV/Å³", 3),
                       format_metric(v.stress_rmse, v.num_stresses, "meV/Å³", 3));
  }
  if (v.num_forces > 0) {
    out << fmt::format("  zero-forces baseline MAE {:.2f} meV/Å; model/baseline = {:.3f}\n",
                       v.zero_forces_mae, v.forces_mae / v.zero_forces_mae);
  }
  if (v.per_config_type.size() > 1) {
    for (const auto& [type, m] : v.per_config_type) {
      out << fmt::format("  {:<20} {:>3} structures  E MAE {:>16}  F MAE {:>14}\n", type,
                         m.num_structures, format_metric(m.energy_mae, m.num_energies, "meV/atom"),
                         format_metric(m.forces_mae, m.num_forces, "meV/Å"));
    }
  }
  if (strategy.precision_hook() && strategy.precision_hook()->scaler()) {
    out << fmt::format("  16-mixed gradient scaler: final scale {}\n",
                       strategy.precision_hook()->scale());
  }
  out << fmt::format("wall time {:.1f} s; {} steps, {} epochs{}; run directory {}\n", wall,
                     strategy.step_count, strategy.epoch_count,
                     spike_hook ? fmt::format(", {} skipped steps", spike_hook->skipped_steps())
                                : std::string(),
                     run_dir.string());
  out.flush();

  TrainResult result;
  result.run_dir = run_dir.string();
  result.validation = final_metrics;
  result.wall_seconds = wall;
  result.steps = strategy.step_count;
  result.epochs = strategy.epoch_count;
  return result;
}

}  // namespace crucible
