// A training run from its recipe to its run directory
// (crucible/run/training_run.h): the driver `crucible train` and
// `crucible.train` call.

#include "crucible/run/training_run.h"

#include "crucible/common/dtype_names.h"
#include "crucible/common/error.h"
#include "crucible/distributed/launcher.h"
#include "crucible/distributed/process_group.h"
#include "crucible/models/registry.h"
#include "crucible/report/error_report.h"
#include "crucible/report/metrics_log.h"
#include "crucible/report/progress.h"
#include "crucible/run/model_from_data.h"
#include "crucible/run/model_io.h"
#include "crucible/run/run_dir.h"
#include "crucible/run/run_header.h"
#include "crucible/run/run_lock.h"
#include "crucible/run/training_setup.h"
#include "crucible/training/best_model.h"
#include "crucible/training/checkpointing.h"
#include "crucible/training/ema.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

namespace crucible {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// Checkpoint file with the metrics files' positions and the epoch records' state.
constexpr const char* kMetricsStateFile = "metrics_state.json";

/// A resumed run's metrics files continue from checkpoint `index`: cut back
/// to what it recorded, the epoch records' state restored. A checkpoint
/// without that file (written before issue 15) appends as before.
/// @throws DataError naming the file when its content is unreadable.
void resume_metrics(const checkpoint::CheckpointStore& store, int64_t index, MetricsCsvHook& csv,
                    MetricsJsonlHook& jsonl, ProgressHook& progress) {
  std::string text;
  try {
    text = store.load_file(index, kMetricsStateFile);
  } catch (const DataError&) {
    return;  // an older checkpoint without it
  }
  const std::string source = "checkpoint " + std::to_string(index) + " " + kMetricsStateFile;
  try {
    const json j = json::parse(text);
    csv.truncate_at_enter(j.at("metrics.csv").at("bytes").get<uint64_t>());
    csv.resume_from(j.at("metrics.csv").at("records").dump(), source);
    jsonl.truncate_at_enter(j.at("metrics.jsonl").at("bytes").get<uint64_t>());
    progress.resume_from(j.at("progress").dump(), source);
  } catch (const json::exception& e) {
    throw DataError(source + ": must be the metrics state of a checkpoint, got " + e.what());
  }
}

json metrics_json(const ErrorMetrics& v) {
  json j;
  for (const auto& [k, val] : v.as_map()) j[k] = std::isfinite(val) ? json(val) : json();
  const double ratio = v.forces_mae / v.zero_forces_mae;
  j["forces_mae_over_zero_forces_mae"] = std::isfinite(ratio) ? json(ratio) : json();
  j["mean_energy_rmse"] = v.num_energies > 1 ? json(v.mean_energy_rmse) : json();  // issue 47
  const double e_ratio = v.energy_rmse / v.mean_energy_rmse;
  j["energy_rmse_over_mean_energy_rmse"] = v.num_energies > 1 && std::isfinite(e_ratio) ? json(e_ratio) : json();
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

/// The data-parallel workers of this process (issue 6): from torchrun /
/// SLURM / Open MPI variables or --nproc; none (a null communicator) when
/// the process runs alone.
struct Workers {
  std::shared_ptr<Communicator> comm;
  int local_rank = 0;
};

Workers join_workers(const Config& config) {
  Workers w;
  const auto env = distributed_env_from_environment();
  if (!env || env->world_size <= 1) return w;
  validate_config(config);
  ProcessGroupOptions po;
  po.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(1000.0 * config.training.distributed.timeout_s));
  po.cuda = parse_device(config.training.device).is_cuda();
  // Fault injection for the end-to-end tests: worker RANK dies during
  // start-up, before the first collective.
  if (const char* r = std::getenv("CRUCIBLE_FAULT_EXIT_AT_START")) {
    if (std::atoi(r) == env->rank) std::_Exit(1);
  }
  w.comm = make_process_group(*env, po);
  signal_launcher_ready();  // joined: from now on a failure is no start-up failure
  w.local_rank = env->local_rank;
  return w;
}

/// The run directory, checked and locked. Issue 15: one writer per run
/// directory, for the whole run, taken before anything in the directory is
/// checked or removed, and (issue 47) before any data is read, so the
/// process started first wins. A fresh directory the lock created goes
/// again if the start is refused. Only the writer (rank 0) locks.
fs::path open_run_dir(const Config& config, const ResumeOptions& resume, bool writer,
                      std::optional<RunDirLock>& lock) {
  if (resume.resume) {
    if (!config.output.run_dir) throw ConfigError("--resume needs a run directory, got none");
    const fs::path run_dir = *config.output.run_dir;
    if (!fs::is_directory(run_dir)) {
      throw ConfigError("--resume " + run_dir.string() + ": must be a run directory with "
                        "config.yaml and checkpoints/, got no such directory");
    }
    if (writer) lock.emplace(run_dir);
    if (!fs::exists(run_dir / "config.yaml") || !fs::exists(run_dir / "checkpoints")) {
      throw ConfigError("--resume " + run_dir.string() + ": must be a run directory with "
                        "config.yaml and checkpoints/, got neither or only one");
    }
    if (finished_run(run_dir)) {
      throw ConfigError("--resume " + run_dir.string() + ": the run finished (summary.json "
                        "exists); nothing to resume");
    }
    return run_dir;
  }
  if (!writer) return config.output.run_dir.value_or("");  // never written by this rank
  validate_config(config);  // a bad recipe creates no directory
  const fs::path run_dir = choose_run_dir(config.output);
  lock.emplace(run_dir);
  check_run_dir(run_dir, config.output);
  return run_dir;
}

/// A resumed run's recipe must match its config.yaml in every key that
/// matters. @throws ConfigError listing the differences.
void check_resumed_recipe(const fs::path& run_dir, const Config& config) {
  const auto diffs = recipe_differences(load_config_file((run_dir / "config.yaml").string()), config);
  if (diffs.empty()) return;
  std::string list;
  for (const auto& d : diffs) list += "\n  " + d;
  throw ConfigError("--resume " + run_dir.string() + ": the recipe must match the "
                    "checkpointed run's, got differences:" + list);
}

/// What a run writes as it goes: the progress bar and lines on `out`,
/// metrics.jsonl (with learning_curve.svg) and metrics.csv in the run
/// directory.
struct OutputHooks {
  std::shared_ptr<ProgressBarHook> bar;
  std::shared_ptr<ProgressHook> progress;
  std::shared_ptr<MetricsJsonlHook> jsonl;
  std::shared_ptr<MetricsCsvHook> csv;
};

OutputHooks make_output_hooks(std::ostream& out, const TrainingSetup& setup, const fs::path& run_dir,
                              bool append) {
  const Config& config = setup.config;
  const int64_t epochs = config.training.num_epochs.value_or(0);
  OutputHooks h;
  // On a terminal a live bar per epoch (before the epoch lines it must not cut).
  ProgressBarOptions bar_options;
  bar_options.tty = (&out == &std::cout) && stdout_is_terminal();
  h.bar = std::make_shared<ProgressBarHook>(out, setup.loader->size(), epochs, bar_options);
  h.progress = std::make_shared<ProgressHook>(out, epochs);
  MetricsJsonlOptions jsonl_options;
  jsonl_options.log_every_n_steps = config.output.log_every_n_steps;
  jsonl_options.learning_curve_path = (run_dir / "learning_curve.svg").string();
  jsonl_options.append = append;
  h.jsonl = std::make_shared<MetricsJsonlHook>((run_dir / "metrics.jsonl").string(), jsonl_options);
  h.csv = std::make_shared<MetricsCsvHook>((run_dir / "metrics.csv").string(), setup.loss_terms, append);
  return h;
}

/// The checkpoint cadence and the files each checkpoint carries besides
/// the strategy's state: the recipe (load_training_from_checkpoint rebuilds
/// the run from it), the CPU threads (a resume with training.num_threads 0
/// takes them instead of measuring anew, so it continues exactly) and
/// (issue 15) how far each metrics file had been written, so a resume cuts
/// them back there.
CheckpointHookOptions checkpoint_options(const Config& config, const OutputHooks& h) {
  CheckpointHookOptions o;
  o.every_n_steps = config.output.checkpoint_every_n_steps;
  o.every_n_epochs = config.output.checkpoint_every_n_epochs;
  o.extra_files = {{kRecipeFile, config_to_spec_json(config)},
                   {kThreadsFile, json{{"cpu_threads", at::get_num_threads()}}.dump()}};
  o.dynamic_files = [csv = h.csv, jsonl = h.jsonl, progress = h.progress]() {
    json state;
    state["metrics.csv"] = {{"bytes", csv->bytes_written()}, {"records", json::parse(csv->state_json())}};
    state["metrics.jsonl"] = {{"bytes", jsonl->bytes_written()}};
    state["progress"] = json::parse(progress->state_json());
    return std::vector<std::pair<std::string, std::string>>{{kMetricsStateFile, state.dump()}};
  };
  return o;
}

struct Checkpoints {
  std::shared_ptr<checkpoint::CheckpointStore> store;
  std::shared_ptr<CheckpointHook> hook;
};

/// The run's checkpoint store and hook, registered. A fresh run (writer)
/// writes config.yaml first; a resumed one restores its checkpoint (the
/// newest intact one unless resume.checkpoint) and cuts the metrics files
/// back to it. Other ranks only handle signals (agreed stops).
Checkpoints start_checkpoints(TrainingSetup& setup, const fs::path& run_dir, const ResumeOptions& resume,
                              bool writer, const OutputHooks& h, const std::string& command_line,
                              std::ostream& out, std::ostream& err) {
  const Config& config = setup.config;
  TrainingStrategy& strategy = *setup.strategy;
  checkpoint::RetentionPolicy retention;
  retention.keep_last = static_cast<size_t>(config.output.keep_last_checkpoints);
  retention.keep_best_by = "forces_mae";
  Checkpoints c;
  if (!resume.resume && writer) {
    prepare_run_dir(run_dir);
    std::string header = "# Resolved configuration of this run (every key).\n";
    if (!command_line.empty()) header += "# Command: " + command_line + "\n";
    write_file_atomically(run_dir / "config.yaml", header + dump_config(config, false));
    std::error_code ec;
    fs::remove_all(run_dir / "checkpoints", ec);  // an overwritten run's
  }
  if (resume.resume && writer) probe_writable(run_dir);
  c.store = std::make_shared<checkpoint::CheckpointStore>(run_dir / "checkpoints", retention);
  if (resume.resume && writer) {
    // Leftovers of a save that a kill interrupted (.tmp-* folders): we hold
    // the run-directory lock, so no other writer can own them (issue 15).
    try {
      c.store->collect_garbage();
    } catch (const std::exception&) {
      // a corrupt manifest: restore_checkpoint below reports it
    }
  }
  c.hook = std::make_shared<CheckpointHook>(c.store, checkpoint_options(config, h));
  strategy.register_hook(c.hook);
  if (!resume.resume) return c;
  // The checkpoint's own recipe and models must match this run's too.
  const auto restored = restore_checkpoint(*c.store, strategy, resume.checkpoint,
                                           {same_recipe_validator(config), same_models_validator(strategy)});
  if (config.training.num_threads == 0) {
    if (const auto n = checkpoint_thread_count(*c.store, restored.index); n && *n != at::get_num_threads()) {
      at::set_num_threads(*n);
      out << fmt::format("  CPU threads {}, as the checkpoint was written with (training.num_threads 0)\n", *n);
    }
  }
  for (const auto& f : restored.skipped) {
    err << "crucible: warning: checkpoint " << f.index << " is damaged (" << f.message
        << "); using an older one\n";
  }
  if (writer) resume_metrics(*c.store, restored.index, *h.csv, *h.jsonl, *h.progress);
  out << fmt::format("resuming from checkpoint {} (step {}, epoch {}, batch {} of the epoch)\n",
                     restored.index, strategy.step_count, strategy.epoch_count,
                     strategy.epoch_step_count);
  return c;
}

/// Hooks the end-to-end tests plant through environment variables: a real
/// SIGTERM after batch N, a slow run, a full disk from batch N on, a worker
/// killed after batch N. None is registered when the variables are unset.
void register_fault_injection(TrainingStrategy& strategy) {
  // Fault injection for the end-to-end tests: a real SIGTERM after batch N.
  if (const char* at = std::getenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH")) {
    const int64_t n = std::atoll(at);
    strategy.register_hook(std::make_shared<LambdaHook>(
        "fault injection", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
        [n](TrainContext& ctx, TrainingStage) {
          if (ctx.batch_count == n) std::raise(SIGTERM);
        }));
  }
  // ... a slow run (the run-directory lock tests): sleep N ms after each batch.
  if (const char* ms = std::getenv("CRUCIBLE_FAULT_SLEEP_MS_PER_BATCH")) {
    const int64_t n = std::atoll(ms);
    strategy.register_hook(std::make_shared<LambdaHook>(
        "fault injection", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
        [n](TrainContext&, TrainingStage) {
          std::this_thread::sleep_for(std::chrono::milliseconds(n));
        }));
  }
  // ... a full disk from batch N on: writes of more than 4 KiB fail (EFBIG).
  if (const char* at = std::getenv("CRUCIBLE_FAULT_FILE_SIZE_LIMIT_AT_BATCH")) {
    const int64_t n = std::atoll(at);
    strategy.register_hook(std::make_shared<LambdaHook>(
        "fault injection", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
        [n](TrainContext& ctx, TrainingStage) {
          if (ctx.batch_count != n) return;
          struct rlimit lim {};
          lim.rlim_cur = lim.rlim_max = 4096;
          ::setrlimit(RLIMIT_FSIZE, &lim);
        }));
  }
  // ... and a worker that dies (SIGKILL) after batch N: "RANK:N".
  if (const char* spec = std::getenv("CRUCIBLE_FAULT_KILL_AT_BATCH")) {
    const std::string text(spec);
    const auto colon = text.find(':');
    const int rank = std::atoi(text.substr(0, colon).c_str());
    const int64_t n = colon == std::string::npos ? -1 : std::atoll(text.substr(colon + 1).c_str());
    if (rank == strategy.global_rank) {
      strategy.register_hook(std::make_shared<LambdaHook>(
          "fault injection", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
          [n](TrainContext& ctx, TrainingStage) {
            if (ctx.batch_count == n) std::raise(SIGKILL);
          }));
    }
  }
}

/// The TrainResult of a run a signal stopped (here or on another worker),
/// after printing where it stopped and how to resume.
TrainResult stopped_result(const TrainingStrategy& strategy, const CheckpointHook& ckpt_hook,
                           int64_t batches_per_epoch, const fs::path& run_dir, std::ostream& out) {
  // The epoch as the progress lines number it (1-based, the one running).
  const std::string where =
      strategy.epoch_step_count > 0
          ? fmt::format("epoch {}, batch {} of {}", strategy.epoch_count + 1,
                        strategy.epoch_step_count, batches_per_epoch)
          : fmt::format("end of epoch {}", strategy.epoch_count);
  // A stop without a signal here, in a process of its own, was a hook's
  // request (a Python hook that raised, issue 49).
  const bool by_signal = ckpt_hook.signal_number() != 0 || strategy.world_size > 1;
  out << fmt::format("stopped {} after step {} ({}); checkpoint written to {}\n"
                     "resume with: crucible train --resume {}\n",
                     by_signal ? "by a signal" : "at a hook's request", strategy.step_count, where,
                     (run_dir / "checkpoints").string(), run_dir.string());
  out.flush();
  TrainResult stopped;
  stopped.run_dir = run_dir.string();
  stopped.steps = strategy.step_count;
  stopped.epochs = strategy.epoch_count;
  stopped.stopped = true;
  stopped.signal = ckpt_hook.signal_number() ? ckpt_hook.signal_number() : by_signal ? SIGTERM : 0;
  return stopped;
}

/// What finish_run saved as model.pt.
struct SavedModel {
  ValidationSummary final_metrics;     ///< the last validation of the live (or EMA) weights.
  ValidationSummary model_pt_metrics;  ///< of model.pt's weights.
  bool keep_best = false;              ///< model.pt holds the best validation's weights.
  bool ema = false;                    ///< the weights are the EMA's.
};

/// Saves model.pt / model.json (and model_last.pt when model.pt keeps the
/// best validation's weights). With EMA for validation, model.pt holds the
/// averaged weights (MACE); with output.model_pt = best, those of the best
/// validation (MACE and NequIP export the best model), the last ones beside it.
SavedModel save_run_model(const TrainingSetup& setup, const fs::path& run_dir,
                          const ValidationSummary& final_metrics) {
  const Config& config = setup.config;
  const TrainingConfig& tc = config.training;
  TrainingStrategy& strategy = *setup.strategy;
  ModelMetadata meta = model_metadata(config, *setup.model, setup.dtype, setup.elements, setup.e0,
                                      setup.e0_source, setup.scale, setup.shift, setup.min_pair_distance);
  meta.origin = setup.origin;
  auto inference = tc.ema.use_for_validation ? strategy.inference_model() : nullptr;
  EnergyModel& saved = inference ? *inference : *setup.model;
  const BestModelHook* best = setup.best_hook.get();
  SavedModel s;
  s.final_metrics = final_metrics;
  s.model_pt_metrics = final_metrics;
  s.ema = inference != nullptr;
  s.keep_best = config.output.model_pt == "best" && best && best->has_best();
  if (s.keep_best) {
    save_model_weights((run_dir / "model_last.pt").string(), saved);
    best->copy_best_into(saved.module());
    EvaluateOptions eo;
    eo.batch_size = tc.valid_batch_size;
    eo.dtype = strategy.batch_dtype();
    s.model_pt_metrics = evaluate_model(saved, *setup.valid_data, at::Device(at::kCPU), eo);
  }
  save_model(run_dir.string(), saved, meta);
  return s;
}

/// summary.json, written last (a run directory with it is finished).
void write_summary(const TrainingSetup& setup, const SavedModel& saved, const ProgressHook& progress,
                   const fs::path& run_dir, double wall) {
  const TrainingConfig& tc = setup.config.training;
  const TrainingStrategy& strategy = *setup.strategy;
  const auto& spike_hook = setup.spike_hook;
  const auto& ema_hook = setup.ema_hook;
  const BestModelHook* best = setup.best_hook.get();
  const bool keep_best = saved.keep_best;
  const auto& model_pt_metrics = saved.model_pt_metrics;
  const auto& final_metrics = saved.final_metrics;
  const auto& train = setup.train;
  const auto& valid = setup.valid;
  double final_loss = std::nan("");
  if (!progress.records().empty()) final_loss = progress.records().back().train_loss;

  json summary;
  summary["finished"] = true;
  summary["run_dir"] = run_dir.string();
  summary["wall_time_s"] = wall;
  summary["epochs_completed"] = strategy.epoch_count;
  summary["steps"] = strategy.step_count;
  if (tc.precision) summary["precision"] = *tc.precision;
  if (strategy.precision_hook() && strategy.precision_hook()->mode() == PrecisionMode::k16Mixed) {
    summary["grad_scale"] = strategy.precision_hook()->scale();  // final 16-mixed loss scale
  }
  summary["skipped_steps"] = spike_hook ? spike_hook->skipped_steps() : 0;
  if (ema_hook) summary["ema_updates"] = ema_hook->num_updates();
  summary["model_weights"] = saved.ema ? "ema" : "live";
  summary["train_structures"] = train.size();
  summary["valid_structures"] = valid.size();
  summary["final_train_loss"] = std::isfinite(final_loss) ? json(final_loss) : json();
  summary["validation"] = summary_json(model_pt_metrics);  // of model.pt's weights
  summary["model_pt"] = {{"weights", keep_best ? "best" : "last"},
                         {"monitor", tc.early_stopping.monitor}};
  if (keep_best) {
    summary["model_pt"]["epoch"] = best->best_epoch();
    summary["model_pt"]["step"] = best->best_step();
    summary["model_pt"]["value"] = best->best();
    summary["last_validation"] = summary_json(final_metrics);  // of model_last.pt
  }
  if (!strategy.finish_reason().empty()) summary["early_stopping"] = strategy.finish_reason();
  summary["units"] = {{"energy_mae", "meV/atom"},  {"energy_rmse", "meV/atom"},
                      {"forces_mae", "meV/Å"},     {"forces_rmse", "meV/Å"},
                      {"stress_mae", "meV/Å^3"},   {"stress_rmse", "meV/Å^3"},
                      {"zero_forces_mae", "meV/Å"}, {"mean_energy_rmse", "meV/atom"}, {"wall_time_s", "s"}};
  write_file_atomically(run_dir / "summary.json", summary.dump(2) + "\n");
}

/// The final lines: validation errors, the scaler, early stopping, what
/// model.pt holds, wall time.
void write_final_report(std::ostream& out, const TrainingSetup& setup, const SavedModel& saved,
                        const fs::path& run_dir, double wall) {
  const TrainingConfig& tc = setup.config.training;
  const TrainingStrategy& strategy = *setup.strategy;
  const auto& spike_hook = setup.spike_hook;
  const BestModelHook* best = setup.best_hook.get();
  const bool keep_best = saved.keep_best;
  const auto& model_pt_metrics = saved.model_pt_metrics;
  const Config& config = setup.config;
  const auto& v = saved.final_metrics;
  out << "final validation (" << v.num_structures << " structures)\n";
  write_error_report(out, v, "  ");  // issue 47: MAE and RMSE, baselines, config_type table
  if (strategy.precision_hook() && strategy.precision_hook()->mode() == PrecisionMode::k16Mixed) {
    out << fmt::format("  16-mixed gradient scaler: final scale {}\n",
                       strategy.precision_hook()->scale());
  }
  if (!strategy.finish_reason().empty()) out << strategy.finish_reason() << "\n";
  if (keep_best) {
    const auto& b = model_pt_metrics;
    out << fmt::format("model.pt: the best validation ({} {:.6g}, after epoch {}, step {}): energy "
                       "MAE {}, forces MAE {}; model_last.pt: the weights above\n",
                       tc.early_stopping.monitor, best->best(), best->best_epoch(),
                       best->best_step(), format_metric(b.energy_mae, b.num_energies, "meV/atom"),
                       format_metric(b.forces_mae, b.num_forces, "meV/Å"));
  } else if (config.output.model_pt == "best") {
    out << fmt::format("model.pt: the last weights (no validation had a finite {})\n",
                       tc.early_stopping.monitor);
  }
  out << fmt::format("wall time {:.1f} s; {} steps, {} epochs{}; run directory {}\n", wall,
                     strategy.step_count, strategy.epoch_count,
                     spike_hook ? fmt::format(", {} skipped steps", spike_hook->skipped_steps())
                                : std::string(),
                     run_dir.string());
  out.flush();
}

}  // namespace

TrainResult run_training(const Config& input_config, std::ostream& out_arg, std::ostream& err,
                         const std::string& command_line, const ResumeOptions& resume,
                         const std::vector<std::shared_ptr<Hook>>& hooks) {
  const auto t0 = std::chrono::steady_clock::now();
  const Workers workers = join_workers(input_config);
  // Rank 0 alone prints and writes (run directory, metrics, checkpoints, model).
  const bool writer = !workers.comm || workers.comm->rank() == 0;
  std::ostringstream discarded;
  std::ostream& out = writer ? out_arg : discarded;
  std::optional<RunDirLock> lock;
  const fs::path run_dir = open_run_dir(input_config, resume, writer, lock);
  TrainingSetup setup = build_training(input_config, hooks, workers.comm, workers.local_rank);
  if (writer) {
    for (const auto& w : setup.warnings) err << "crucible: warning: " << w << "\n";
  }
  if (resume.resume) check_resumed_recipe(run_dir, setup.config);
  setup.config.output.run_dir = run_dir.string();
  TrainingStrategy& strategy = *setup.strategy;
  DataLoader& loader = *setup.loader;

  const OutputHooks output = make_output_hooks(out, setup, run_dir, resume.resume);
  if (writer) {
    for (const auto& h : std::vector<std::shared_ptr<Hook>>{output.bar, output.progress, output.csv, output.jsonl}) {
      strategy.register_hook(h);
    }
  }
  write_run_header(out, setup, run_dir, strategy.target_step_count(loader.size()));
  out.flush();
  const Checkpoints ckpt =
      start_checkpoints(setup, run_dir, resume, writer, output, command_line, out, err);
  register_fault_injection(strategy);
  try {
    strategy.run(loader);
  } catch (const MetricsWriteError& e) {
    // Issue 15: a lost metrics line stops the run like a failed checkpoint.
    throw TrainingError(std::string(e.what()) + "; training stopped (checkpoints: " +
                        describe_newest_checkpoint(*ckpt.store) + "). " +
                        write_failure_advice(e) + ", then resume with: crucible train --resume " +
                        run_dir.string());
  }
  if (strategy.stopped_early() && !strategy.stop_reason().empty()) {
    // NonFiniteLossGuard: the step was not applied; the stop checkpoint holds
    // the last good state.
    throw TrainingError(fmt::format(
        "training stopped: {}. The optimizer step was not applied: the weights are those after "
        "step {}{}. Lower training.optimizer.lr, check the data, or set "
        "training.spike_skipping.enabled=true to skip such steps; resume with: crucible train "
        "--resume {}",
        strategy.stop_reason(), strategy.step_count,
        writer ? ", checkpointed in " + (run_dir / "checkpoints").string() : std::string(),
        run_dir.string()));
  }
  if (strategy.stopped_early()) {  // a signal here or on another worker
    return stopped_result(strategy, *ckpt.hook, loader.size(), run_dir, out);
  }
  if (!output.jsonl->curve_error().empty()) {
    err << "crucible: warning: " << output.jsonl->curve_error() << "\n";
  }
  const ValidationSummary final_metrics =
      strategy.last_validation() ? *strategy.last_validation() : strategy.validate();
  TrainResult result;
  result.steps = strategy.step_count;
  result.epochs = strategy.epoch_count;
  if (!writer) {
    result.validation = final_metrics;
    return result;
  }
  const SavedModel saved = save_run_model(setup, run_dir, final_metrics);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_summary(setup, saved, *output.progress, run_dir, wall);
  write_final_report(out, setup, saved, run_dir, wall);
  result.run_dir = run_dir.string();
  result.validation = saved.model_pt_metrics;
  result.wall_seconds = wall;
  return result;
}

}  // namespace crucible
