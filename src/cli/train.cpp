// `crucible train`: config + data in, run directory out.

#include "crucible/common/dtype_names.h"
#include "crucible/cli/commands.h"
#include "crucible/cli/fine_tuning.h"
#include "crucible/cli/model_io.h"
#include "crucible/cli/learning_curve.h"
#include "crucible/cli/metrics_log.h"
#include "crucible/cli/progress.h"
#include "crucible/cli/error_report.h"
#include "crucible/cli/run_lock.h"
#include "crucible/cli/training_setup.h"
#include "crucible/common/error.h"
#include "crucible/data/dataset.h"
#include "crucible/distributed/launcher.h"
#include "crucible/distributed/process_group.h"
#include "crucible/data/deepmd.h"
#include "crucible/data/extxyz.h"
#include "crucible/losses/loss.h"
#include "crucible/models/registry.h"

#include <fmt/ranges.h>
#include "crucible/training/best_model.h"
#include "crucible/training/checkpointing.h"
#include "crucible/training/metrics.h"
#include "crucible/training/ema.h"
#include "crucible/training/gradient_accumulation.h"
#include "crucible/training/gradient_clipping.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <set>
#include <sstream>

namespace crucible {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

/// The run directory to use (runs/<timestamp> when unset); nothing in it is
/// looked at yet. @throws ConfigError if it names an existing file.
fs::path choose_run_dir(const OutputConfig& o) {
  if (!o.run_dir) {
    const fs::path base = fs::path("runs") / timestamp();
    fs::path p = base;
    for (int i = 2; fs::exists(p); ++i) p = base.string() + "-" + std::to_string(i);
    return p;
  }
  const fs::path p(*o.run_dir);
  if (fs::exists(p) && !fs::is_directory(p)) {
    throw ConfigError("output.run_dir must be a directory, got '" + p.string() +
                      "', which is an existing file");
  }
  return p;
}

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

/// True when `dir` holds a finished run: a summary.json that parses as a
/// JSON object (summary.json is written last and atomically; an empty or
/// torn one, e.g. copied by hand or cut by a full disk, is not a finish).
bool finished_run(const fs::path& dir) {
  std::ifstream in(dir / "summary.json");
  if (!in) return false;
  try {
    const json j = json::parse(in);
    return j.is_object() && j.contains("steps");
  } catch (const json::exception&) {
    return false;
  }
}

/// Under the run-directory lock: refuses a finished or non-empty directory
/// unless output.overwrite.
void check_run_dir(const fs::path& p, const OutputConfig& o) {
  if (o.overwrite) return;
  if (finished_run(p)) {
    throw ConfigError("output.run_dir '" + p.string() +
                      "' holds a finished run (summary.json exists); choose another "
                      "output.run_dir or set output.overwrite=true to replace it");
  }
  if (!run_dir_is_empty(p)) {
    throw ConfigError("output.run_dir '" + p.string() +
                      "' exists and is not empty (an unfinished run?); choose another "
                      "output.run_dir or set output.overwrite=true");
  }
}

// Writes and removes a 1 MiB file in `dir` (with fsync): an unwritable,
// read-only or full run directory is found before anything is trained or
// removed. @throws DataError naming the directory and the system's reason.
void probe_writable(const fs::path& dir) {
  const fs::path probe = dir / (".crucible-write-probe-" + std::to_string(::getpid()));
  auto fail = [&](const std::string& why) {
    ::unlink(probe.c_str());
    throw DataError(dir.string() + ": run directory must be writable with free space, got " + why +
                    " (a 1 MiB probe write failed before training; nothing of the run was changed)");
  };
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail(std::strerror(errno));
  std::vector<char> zeros(1 << 16, 0);
  for (int i = 0; i < 16; ++i) {
    size_t done = 0;
    while (done < zeros.size()) {
      const ssize_t n = ::write(fd, zeros.data() + done, zeros.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int e = n < 0 ? errno : ENOSPC;
        ::close(fd);
        fail(std::strerror(e));
      }
      done += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail(std::strerror(e));
  }
  if (::close(fd) != 0) fail(std::strerror(errno));
  ::unlink(probe.c_str());
}

void prepare_run_dir(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) throw DataError(p.string() + ": run directory cannot be created (" + ec.message() + ")");
  probe_writable(p);
  // summary.json first: from now on the directory must not look finished.
  for (const char* f : {"summary.json", "model.pt", "model_last.pt", "model.json", "metrics.csv", "metrics.jsonl",
                        "learning_curve.svg", "config.yaml"}) {
    fs::remove(p / f, ec);
    if (ec) throw DataError((p / f).string() + ": cannot remove old file (" + ec.message() + ")");
  }
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


}  // namespace

/// `p` (which exists) must be a regular file. @throws DataError naming `key`.
void require_regular_file(const fs::path& p, const std::string& key, const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  const std::string what = key + " file '" + path + "'";
  if (ec) throw DataError(what + " cannot be read (" + ec.message() + ")");
  switch (st.type()) {
    case fs::file_type::regular: return;
    case fs::file_type::directory:
      if (is_deepmd_path(p.string())) return;  // a DeePMD system (issue 18)
      throw DataError(what + " is a directory without a DeePMD system (type.raw in it or up to 16 levels below); data files "
                      "are extended-XYZ files (.xyz, .extxyz) or DeePMD system directories");
    case fs::file_type::fifo:
      throw DataError(what + " is a FIFO (named pipe); data files must be regular files");
    case fs::file_type::character:
    case fs::file_type::block:
      throw DataError(what + " is a device; data files must be regular files");
    default:
      throw DataError(what + " is not a regular file (a socket or other special file)");
  }
}

/// True if `p` exists; a symlink loop or an unreadable path is a DataError
/// naming `key` (fs::exists would throw an internal filesystem_error).
bool data_path_exists(const fs::path& p, const std::string& key, const std::string& path) {
  std::error_code ec;
  const bool found = fs::exists(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw DataError(key + " file '" + path + "' cannot be read (" + ec.message() + ")");
  }
  return found;
}

std::string resolve_data_path(const std::string& path, const std::string& key) {
  const fs::path p(path);
  std::vector<std::string> tried;
  if (data_path_exists(p, key, path)) {
    require_regular_file(p, key, path);
    return fs::absolute(p).lexically_normal().string();
  }
  tried.push_back(fs::absolute(p).lexically_normal().string());
#ifdef CRUCIBLE_DATA_DIR
  if (p.is_relative()) {
    auto it = p.begin();
    if (it != p.end() && it->string() == "data") {
      fs::path alt(CRUCIBLE_DATA_DIR);
      for (++it; it != p.end(); ++it) alt /= *it;
      if (data_path_exists(alt, key, path)) {
        require_regular_file(alt, key, path);
        return alt.lexically_normal().string();
      }
      tried.push_back(alt.lexically_normal().string());
    }
  }
#endif
  std::string where;
  for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
  throw DataError(key + " file '" + path + "' does not exist (looked in: " + where + ")");
}

std::string resolve_config_path(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return path;
  std::vector<std::string> tried{fs::absolute(p).lexically_normal().string()};
#ifdef CRUCIBLE_DATA_DIR
  if (p.is_relative()) {  // issue 47: configs/x.yaml falls back to the source tree, as data/ does
    auto it = p.begin();
    if (it != p.end() && it->string() == "configs") {
      fs::path alt = fs::path(CRUCIBLE_DATA_DIR).parent_path() / "configs";
      for (++it; it != p.end(); ++it) alt /= *it;
      if (fs::is_regular_file(alt, ec)) return alt.lexically_normal().string();
      tried.push_back(alt.lexically_normal().string());
    }
  }
#endif
  std::string where;
  for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
  throw ConfigError("--config file '" + path + "' does not exist or is not a file (looked in: " + where + ")");
}

TrainResult run_training(const Config& input_config, std::ostream& out_arg, std::ostream& err,
                         const std::string& command_line, const ResumeOptions& resume) {
  const auto t0 = std::chrono::steady_clock::now();
  // Data parallel (issue 6): torchrun / SLURM / Open MPI variables or --nproc.
  std::shared_ptr<Communicator> comm;
  int local_rank = 0;
  if (const auto env = distributed_env_from_environment(); env && env->world_size > 1) {
    validate_config(input_config);
    ProcessGroupOptions po;
    po.timeout = std::chrono::milliseconds(
        static_cast<int64_t>(1000.0 * input_config.training.distributed.timeout_s));
    po.cuda = parse_device(input_config.training.device).is_cuda();
    // Fault injection for the end-to-end tests: worker RANK dies during
    // start-up, before the first collective.
    if (const char* r = std::getenv("CRUCIBLE_FAULT_EXIT_AT_START")) {
      if (std::atoi(r) == env->rank) std::_Exit(1);
    }
    comm = make_process_group(*env, po);
    signal_launcher_ready();  // joined: from now on a failure is no start-up failure
    local_rank = env->local_rank;
  }
  // Rank 0 alone prints and writes (run directory, metrics, checkpoints, model).
  const bool writer = !comm || comm->rank() == 0;
  std::ostringstream discarded;
  std::ostream& out = writer ? out_arg : discarded;
  fs::path run_dir;
  // Issue 15: one writer per run directory, for the whole command, taken
  // before anything in the directory is checked or removed, and (issue 47)
  // before any data is read, so the process started first wins. A fresh
  // directory the lock created goes again if the start is refused.
  std::optional<RunDirLock> lock;
  if (resume.resume) {
    if (!input_config.output.run_dir) throw ConfigError("--resume needs a run directory, got none");
    run_dir = *input_config.output.run_dir;
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
  } else if (writer) {
    validate_config(input_config);  // a bad recipe creates no directory
    run_dir = choose_run_dir(input_config.output);
    lock.emplace(run_dir);
    check_run_dir(run_dir, input_config.output);
  } else {
    run_dir = input_config.output.run_dir.value_or("");  // never written by this rank
  }
  TrainingSetup setup = build_training(input_config, {}, comm, local_rank);
  if (writer) {
    for (const auto& w : setup.warnings) err << "crucible: warning: " << w << "\n";
  }
  Config& config = setup.config;
  const auto& tc = config.training;
  const at::Device device = setup.device;
  const std::string dtype_name = ::crucible::dtype_name(setup.dtype);
  const std::string& train_path = config.data.train_file;
  const auto& train = setup.train;
  const auto& valid = setup.valid;
  const LabelCounts& tl = setup.train_labels;
  const LabelCounts& vl = setup.valid_labels;
  const auto& elements = setup.elements;
  const at::Tensor& e0 = setup.e0;
  const double scale = setup.scale, shift = setup.shift;
  EnergyModel& model = *setup.model;
  DataLoader& loader = *setup.loader;
  TrainingStrategy& strategy = *setup.strategy;
  const auto& spike_hook = setup.spike_hook;
  const auto& ema_hook = setup.ema_hook;

  if (resume.resume) {
    const auto diffs = recipe_differences(load_config_file((run_dir / "config.yaml").string()),
                                          config);
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      throw ConfigError("--resume " + run_dir.string() + ": the recipe must match the "
                        "checkpointed run's, got differences:" + list);
    }
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
  auto csv = std::make_shared<MetricsCsvHook>((run_dir / "metrics.csv").string(), setup.loss_terms,
                                              /*append=*/resume.resume);
  if (writer) {
    for (const auto& h : std::vector<std::shared_ptr<Hook>>{bar, progress, csv, jsonl}) {
      strategy.register_hook(h);
    }
  }
  const int64_t target_steps = strategy.target_step_count(loader.size());
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
  out << fmt::format("  data       {} ({})\n", train_path, setup.split_text);
  out << fmt::format("  train      {} structures, {} atoms (energy {}, forces {}, stress {})\n",
                     train.size(), tl.atoms, tl.energy, tl.forces, tl.stress);
  out << fmt::format("  validation {} structures, {} atoms (energy {}, forces {}, stress {})\n",
                     valid.size(), vl.atoms, vl.energy, vl.forces, vl.stress);
  out << fmt::format("  units      energy {}, forces {}, stress {} (converted to eV, eV/Å, eV/Å³)\n",
                     config.data.energy_unit.to_string(), config.data.forces_unit.to_string(),
                     config.data.stress_unit.to_string());
  out << fmt::format("  elements   {}\n", elem_text);
  out << fmt::format("  E0 (eV)    {} ({})\n", e0_text, setup.e0_source);
  out << fmt::format("  scale      {:.6g} eV, shift {:.6g} eV/atom ({})\n", scale, shift,
                     config.model.init_from ? std::string("the source model's")
                                            : fmt::format("model.scaling {}, model.shift {}",
                                                          config.model.scaling, config.model.shift));
  if (is_imported_model(*setup.model)) {
    // Issue 46: the architecture is the imported source's, not the config's keys.
    nlohmann::json h = model_factory(config.model.type).to_json(*setup.model);
    h.erase("u_columns");
    h.erase("atomic_numbers");
    std::string keys;
    for (const auto& [k, v] : h.items()) keys += fmt::format("{}{} {}", keys.empty() ? "" : ", ", k, v.is_string() ? v.get<std::string>() : v.dump());
    out << fmt::format("  model      {} from model.init_from {}: {}; {} parameters\n", config.model.type,
                       *config.model.init_from, keys, setup.num_parameters);
  } else {
    // The model.type's own keys (issue 16), then the cutoff.
    std::string keys;
    for (const auto& k : model_factory(config.model.type).keys) {
      const ModelParamValue& v = config.model.params.at(config.model.type + "." + k.name);
      std::string text;
      if (const auto* b = std::get_if<bool>(&v)) text = *b ? "true" : "false";
      if (const auto* i = std::get_if<int64_t>(&v)) text = std::to_string(*i);
      if (const auto* d = std::get_if<double>(&v)) text = fmt::format("{}", *d);
      if (const auto* str = std::get_if<std::string>(&v)) text = *str;
      if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) text = fmt::format("[{}]", fmt::join(*l, ", "));
      if (k.name == "avg_num_neighbors") {  // 0 = computed from the training set: print what the model uses
        const nlohmann::json h = model_factory(config.model.type).to_json(*setup.model);
        if (h.contains("avg_num_neighbors")) {
          text = fmt::format("{:.6g}{}", h.at("avg_num_neighbors").get<double>(), text == "0" ? " (training set)" : "");
        }
      }
      keys += fmt::format("{}{} {}", keys.empty() ? "" : ", ", k.name, text);
    }
    out << fmt::format("  model      {}: {}, cutoff {} Å; {} parameters\n", config.model.type, keys,
                       config.model.cutoff, setup.num_parameters);
  }
  out << fmt::format("  loss       {}\n", setup.loss_text);
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
  const std::optional<int64_t> stage_two_start = setup.stage_two_start;
  if (spike_hook || ema_hook || stage_two_start) {
    std::string extras;
    if (spike_hook) {
      extras += fmt::format("spike skipping k {} window {} min_history {}", tc.spike_skipping.k,
                            tc.spike_skipping.window, tc.spike_skipping.min_history);
    }
    if (ema_hook) {
      extras += fmt::format("{}EMA decay {} every {} from step {}{}", extras.empty() ? "" : "; ",
                            tc.ema.decay, tc.ema.update_every, tc.ema.start_step,
                            tc.ema.use_for_validation ? " (validation and model.pt use it)" : "");
      if (tc.ema.warmup) extras += ", warmup min(decay, (1+k)/(10+k))";
    }
    if (stage_two_start) {
      extras += fmt::format("{}stage two from epoch {} (counted from 0): lr {}, weights energy {} "
                            "forces {} stress {}",
                            extras.empty() ? "" : "; ", *stage_two_start, tc.stage_two.lr,
                            tc.stage_two.energy_weight, tc.stage_two.forces_weight,
                            tc.stage_two.stress_weight);
    }
    out << fmt::format("  updates    {}\n", extras);
  }
  out << fmt::format("  model.pt   {}{}\n",
                     config.output.model_pt == "best"
                         ? fmt::format("the best validation by {}{} (the last weights in model_last.pt)",
                                       tc.early_stopping.monitor,
                                       stage_two_start ? " within stage two" : "")
                         : std::string("the last weights"),
                     tc.early_stopping.patience > 0
                         ? fmt::format("; early stopping after {} validations without improvement",
                                       tc.early_stopping.patience)
                         : std::string());
  out << fmt::format("  device     {}, {}, CPU threads: {}\n", device.str(),
                     tc.precision ? dtype_name + ", precision " + *tc.precision : tc.dtype,
                     setup.threads.describe());
  out << fmt::format("  memory     {}\n", setup.memory.describe(setup.memory_available));
  out << fmt::format("  run_dir    {}\n", run_dir.string());
  out.flush();

  // ---- checkpoints: cadence, end of training, SIGINT/SIGTERM.
  checkpoint::RetentionPolicy retention;
  retention.keep_last = static_cast<size_t>(config.output.keep_last_checkpoints);
  retention.keep_best_by = "forces_mae";
  CheckpointHookOptions ckpt_options;
  ckpt_options.every_n_steps = config.output.checkpoint_every_n_steps;
  ckpt_options.every_n_epochs = config.output.checkpoint_every_n_epochs;
  // Each checkpoint carries the recipe: load_training_from_checkpoint rebuilds the run from it.
  // ... and the CPU threads it ran with: a resume with training.num_threads
  // 0 (auto) takes them instead of measuring anew, so it continues exactly.
  ckpt_options.extra_files = {{kRecipeFile, config_to_spec_json(config)},
                              {kThreadsFile, json{{"cpu_threads", at::get_num_threads()}}.dump()}};
  // Issue 15: how far each metrics file had been written, and the epoch
  // records' state, so a resume cuts them back there and continues exactly.
  ckpt_options.dynamic_files = [csv, jsonl, progress]() {
    json state;
    state["metrics.csv"] = {{"bytes", csv->bytes_written()}, {"records", json::parse(csv->state_json())}};
    state["metrics.jsonl"] = {{"bytes", jsonl->bytes_written()}};
    state["progress"] = json::parse(progress->state_json());
    return std::vector<std::pair<std::string, std::string>>{{kMetricsStateFile, state.dump()}};
  };
  std::shared_ptr<checkpoint::CheckpointStore> store;
  std::shared_ptr<CheckpointHook> ckpt_hook;

  // ---- run directory: config first, summary last.
  if (resume.resume) {
    if (writer) probe_writable(run_dir);
    store = std::make_shared<checkpoint::CheckpointStore>(run_dir / "checkpoints", retention);
    // Leftovers of a save that a kill interrupted (.tmp-* folders): we hold
    // the run-directory lock, so no other writer can own them (issue 15).
    if (writer) {
      try {
        store->collect_garbage();
      } catch (const std::exception&) {
        // a corrupt manifest: restore_checkpoint below reports it
      }
    }
    ckpt_hook = std::make_shared<CheckpointHook>(store, ckpt_options);
    strategy.register_hook(ckpt_hook);
    // The checkpoint's own recipe and models must match this run's too.
    const auto restored =
        restore_checkpoint(*store, strategy, resume.checkpoint,
                           {same_recipe_validator(config), same_models_validator(strategy)});
    if (tc.num_threads == 0) {
      if (const auto n = checkpoint_thread_count(*store, restored.index); n && *n != at::get_num_threads()) {
        at::set_num_threads(*n);
        out << fmt::format("  CPU threads {}, as the checkpoint was written with (training.num_threads 0)\n", *n);
      }
    }
    for (const auto& f : restored.skipped) {
      err << "crucible: warning: checkpoint " << f.index << " is damaged (" << f.message
          << "); using an older one\n";
    }
    if (writer) resume_metrics(*store, restored.index, *csv, *jsonl, *progress);
    out << fmt::format("resuming from checkpoint {} (step {}, epoch {}, batch {} of the epoch)\n",
                       restored.index, strategy.step_count, strategy.epoch_count,
                       strategy.epoch_step_count);
  } else if (writer) {
    prepare_run_dir(run_dir);
    std::string header = "# Resolved configuration of this run (every key).\n";
    if (!command_line.empty()) header += "# Command: " + command_line + "\n";
    write_file_atomically(run_dir / "config.yaml", header + dump_config(config, false));
    std::error_code ec;
    fs::remove_all(run_dir / "checkpoints", ec);  // an overwritten run's
    store = std::make_shared<checkpoint::CheckpointStore>(run_dir / "checkpoints", retention);
    ckpt_hook = std::make_shared<CheckpointHook>(store, ckpt_options);
    strategy.register_hook(ckpt_hook);
  } else {
    // Other ranks: the hook handles signals (agreed stops); only rank 0 writes.
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
  try {
    strategy.run(loader);
  } catch (const MetricsWriteError& e) {
    // Issue 15: a lost metrics line stops the run like a failed checkpoint.
    throw TrainingError(std::string(e.what()) + "; training stopped (checkpoints: " +
                        describe_newest_checkpoint(*store) + "). " +
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
    // The epoch as the progress lines number it (1-based, the one running).
    const std::string where =
        strategy.epoch_step_count > 0
            ? fmt::format("epoch {}, batch {} of {}", strategy.epoch_count + 1,
                          strategy.epoch_step_count, loader.size())
            : fmt::format("end of epoch {}", strategy.epoch_count);
    const int sig = ckpt_hook->signal_number() ? ckpt_hook->signal_number() : SIGTERM;
    out << fmt::format("stopped by a signal after step {} ({}); checkpoint written to {}\n"
                       "resume with: crucible train --resume {}\n",
                       strategy.step_count, where, (run_dir / "checkpoints").string(),
                       run_dir.string());
    out.flush();
    TrainResult stopped;
    stopped.run_dir = run_dir.string();
    stopped.steps = strategy.step_count;
    stopped.epochs = strategy.epoch_count;
    stopped.stopped = true;
    stopped.signal = sig;
    return stopped;
  }
  if (!jsonl->curve_error().empty()) {
    err << "crucible: warning: " << jsonl->curve_error() << "\n";
  }
  ValidationSummary final_metrics =
      strategy.last_validation() ? *strategy.last_validation() : strategy.validate();
  if (!writer) {
    TrainResult result;
    result.validation = final_metrics;
    result.steps = strategy.step_count;
    result.epochs = strategy.epoch_count;
    return result;
  }

  ModelMetadata meta;
  meta.model_type = config.model.type;
  meta.hyperparameters = model_factory(config.model.type).to_json(model);
  meta.dtype = dtype_name;
  meta.atomic_numbers.assign(elements.begin(), elements.end());
  for (int64_t z : elements) meta.e0[z] = e0[z].item<double>();
  meta.e0_source = setup.e0_source;
  meta.origin = setup.origin;
  meta.scale = scale;
  meta.shift = shift;
  if (std::isfinite(setup.min_pair_distance)) meta.min_distance = 0.5 * setup.min_pair_distance;
  meta.data = config.data;
  // With EMA for validation, model.pt holds the averaged weights (MACE);
  // with output.model_pt = best, those of the best validation (MACE and
  // NequIP export the best model), the last ones beside it.
  auto inference = tc.ema.use_for_validation ? strategy.inference_model() : nullptr;
  EnergyModel& saved = inference ? *inference : model;
  const BestModelHook* best = setup.best_hook.get();
  const bool keep_best = config.output.model_pt == "best" && best && best->has_best();
  ValidationSummary model_pt_metrics = final_metrics;
  if (keep_best) {
    save_model_weights((run_dir / "model_last.pt").string(), saved);
    best->copy_best_into(saved.module());
    EvaluateOptions eo;
    eo.batch_size = tc.valid_batch_size;
    eo.dtype = strategy.batch_dtype();
    model_pt_metrics = evaluate_model(saved, *setup.valid_data, at::Device(at::kCPU), eo);
  }
  save_model(run_dir.string(), saved, meta);

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
  if (strategy.precision_hook() && strategy.precision_hook()->mode() == PrecisionMode::k16Mixed) {
    summary["grad_scale"] = strategy.precision_hook()->scale();  // final 16-mixed loss scale
  }
  summary["skipped_steps"] = spike_hook ? spike_hook->skipped_steps() : 0;
  if (ema_hook) summary["ema_updates"] = ema_hook->num_updates();
  summary["model_weights"] = inference ? "ema" : "live";
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

  const auto& v = final_metrics;
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

  TrainResult result;
  result.run_dir = run_dir.string();
  result.validation = model_pt_metrics;
  result.wall_seconds = wall;
  result.steps = strategy.step_count;
  result.epochs = strategy.epoch_count;
  return result;
}

}  // namespace crucible
