#include "crucible/training/checkpointing.h"
#include "crucible/models/registry.h"

#include "crucible/common/error.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <atomic>
#include <cmath>
#include <csignal>
#include <sstream>

namespace crucible {

namespace {

std::atomic<int> g_signal{0};  // the last SIGINT / SIGTERM received, 0 = none
struct sigaction g_old_int, g_old_term;

extern "C" void crucible_checkpoint_signal(int sig) { g_signal.store(sig); }

}  // namespace

std::string models_info_json(const TrainingStrategy& strategy) {
  nlohmann::json info = nlohmann::json::object();
  for (const auto& [name, model] : strategy.models()) {
    int64_t n = 0;
    for (const auto& p : model->module().parameters()) n += p.numel();
    info[name] = {{"name", model->name()},
                  {"cutoff", model->cutoff()},
                  {"elements", model->elements()},
                  {"num_parameters", n}};
    // A registered model also records its hyperparameters (the factory's
    // to_json, as in model.json), which same_models_validator compares.
    for (const auto& f : model_registry()) {
      if (f.type != model->name() || !f.to_json) continue;
      try {
        info[name]["hyperparameters"] = f.to_json(*model);
      } catch (const std::exception&) {
        // A model of that name that is not the factory's class: no record.
      }
    }
  }
  return info.dump(2) + "\n";
}

checkpoint::CheckpointEntry save_checkpoint(
    checkpoint::CheckpointStore& store, TrainingStrategy& strategy, int64_t index,
    const std::string& metric, const std::vector<std::pair<std::string, std::string>>& extra_files) {
  checkpoint::CheckpointCounters counters;
  counters.step_count = strategy.step_count;
  counters.epoch_count = strategy.epoch_count;
  counters.extra = {{"batch_count", strategy.batch_count},
                    {"epoch_step_count", strategy.epoch_step_count},
                    {"global_step_count", strategy.global_step_count}};
  std::optional<checkpoint::CheckpointMetric> m;
  if (!metric.empty() && strategy.last_validation()) {
    const auto values = strategy.last_validation()->as_map();
    auto it = values.find(metric);
    if (it != values.end()) m = checkpoint::CheckpointMetric{metric, it->second};
  }
  std::vector<checkpoint::CheckpointFile> files;
  for (auto& [name, bytes] : strategy.state_files()) {
    files.push_back(checkpoint::CheckpointFile::from_bytes(name, std::move(bytes)));
  }
  files.push_back(checkpoint::CheckpointFile::from_bytes(kModelsInfoFile, models_info_json(strategy)));
  files.push_back(checkpoint::CheckpointFile::from_bytes(kStrategySpecFile, strategy.to_spec() + "\n"));
  for (const auto& [name, bytes] : extra_files) {
    files.push_back(checkpoint::CheckpointFile::from_bytes(name, bytes));
  }
  return store.save(index, counters, files, m);
}

LoadedCheckpoint load_checkpoint(const checkpoint::CheckpointStore& store,
                                 std::optional<int64_t> index,
                                 std::vector<checkpoint::CheckpointFailure>* skipped) {
  LoadedCheckpoint out;
  if (index) {
    auto entry = store.find(*index);
    if (!entry) {
      std::string have;
      for (const auto& e : store.list()) have += (have.empty() ? "" : ", ") + std::to_string(e.index);
      throw DataError(store.manifest_path().string() + ": checkpoint " + std::to_string(*index) +
                      " must be listed, got only [" + have + "]");
    }
    out.entry = *entry;
  } else {
    const auto intact = store.newest_intact();
    if (skipped) *skipped = intact.failed;
    if (!intact.entry) {
      std::string why;
      for (const auto& f : intact.failed) why += "\n  checkpoint " + std::to_string(f.index) + ": " + f.message;
      throw DataError(store.manifest_path().string() +
                      ": must list at least one intact checkpoint, got none" + why);
    }
    out.entry = *intact.entry;
  }
  out.files = store.load(out.entry.index);
  return out;
}

CheckpointValidator same_models_validator(const TrainingStrategy& strategy) {
  return [&strategy](const LoadedCheckpoint& loaded) {
    const std::string file = "checkpoint " + std::to_string(loaded.entry.index) + " " + kModelsInfoFile;
    auto it = loaded.files.find(kModelsInfoFile);
    if (it == loaded.files.end()) {
      throw DataError(file + ": the checkpoint must contain it, got no such file");
    }
    nlohmann::json saved, current;
    try {
      saved = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(file + ": must be JSON, got " + e.what());
    }
    current = nlohmann::json::parse(models_info_json(strategy));
    std::vector<std::string> diffs;
    for (const auto& [name, want] : current.items()) {
      if (!saved.is_object() || !saved.contains(name)) {
        diffs.push_back("model '" + name + "': in this run, not in the checkpoint");
        continue;
      }
      const auto& got = saved[name];
      for (const char* key : {"name", "elements", "num_parameters"}) {
        if (!got.contains(key) || got[key] != want[key]) {
          diffs.push_back("model '" + name + "' " + key + ": checkpoint " +
                          (got.contains(key) ? got[key].dump() : std::string("(missing)")) +
                          ", this run " + want[key].dump());
        }
      }
      // Hyperparameters: compared when both sides record them (checkpoints
      // from before the registry do not).
      if (got.contains("hyperparameters") && want.contains("hyperparameters") &&
          got["hyperparameters"] != want["hyperparameters"]) {
        for (const auto& [key, value] : want["hyperparameters"].items()) {
          const bool has = got["hyperparameters"].contains(key);
          if (has && got["hyperparameters"][key] == value) continue;
          diffs.push_back("model '" + name + "' " + key + ": checkpoint " +
                          (has ? got["hyperparameters"][key].dump() : std::string("(missing)")) + ", this run " +
                          value.dump());
        }
      }
      if (!got.contains("cutoff") || !got["cutoff"].is_number() ||
          std::abs(got["cutoff"].get<double>() - want["cutoff"].get<double>()) > 1e-12) {
        diffs.push_back("model '" + name + "' cutoff: checkpoint " +
                        (got.contains("cutoff") ? got["cutoff"].dump() : std::string("(missing)")) +
                        " Å, this run " + want["cutoff"].dump() + " Å");
      }
    }
    if (saved.is_object()) {
      for (const auto& [name, _] : saved.items()) {
        if (!current.contains(name)) diffs.push_back("model '" + name + "': in the checkpoint, not in this run");
      }
    }
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      throw DataError(file + ": the checkpoint's models must match this run's, got differences:" + list);
    }
  };
}

namespace {

/// Issue 15: the manifest's counters must be the ones counters.pt restored.
/// @throws DataError naming the checkpoint, the counter and both values.
void check_restored_counters(const LoadedCheckpoint& loaded, const TrainingStrategy& s) {
  const auto& c = loaded.entry.counters;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> pairs = {
      {"step_count", {c.step_count, s.step_count}}, {"epoch_count", {c.epoch_count, s.epoch_count}}};
  for (const auto& [key, mine] :
       std::vector<std::pair<std::string, int64_t>>{{"batch_count", s.batch_count},
                                                   {"epoch_step_count", s.epoch_step_count},
                                                   {"global_step_count", s.global_step_count}}) {
    auto it = c.extra.find(key);
    if (it != c.extra.end()) pairs.push_back({key, {it->second, mine}});
  }
  for (const auto& [key, values] : pairs) {
    if (values.first != values.second) {
      throw DataError("checkpoint " + std::to_string(loaded.entry.index) + " (" + loaded.entry.dir +
                      "): manifest.json says " + key + " " + std::to_string(values.first) +
                      ", counters.pt holds " + std::to_string(values.second) +
                      "; the two must agree");
    }
  }
}

}  // namespace

std::string describe_newest_checkpoint(const checkpoint::CheckpointStore& store) {
  try {
    const auto entries = store.list();
    if (entries.empty()) return "no earlier checkpoint";
    return "the newest, " + entries.back().dir + " (step " +
           std::to_string(entries.back().counters.step_count) + "), is intact";
  } catch (const std::exception&) {
    return "the manifest cannot be read either";
  }
}

std::string write_failure_advice(const std::exception& e) {
  int code = 0;
  if (const auto* se = dynamic_cast<const std::system_error*>(&e)) code = se->code().value();
  const std::string what = e.what();
  auto has = [&](int err) { return code == err || what.find(std::strerror(err)) != std::string::npos; };
  if (has(ENOSPC) || has(EDQUOT)) return "The disk (or quota) is full: free disk space";
  if (has(EFBIG)) return "A file-size limit was reached (ulimit -f, or the file system's maximum): raise it";
  if (has(EACCES) || has(EPERM)) return "Permission denied: make the run directory writable by this user";
  if (has(EROFS)) return "The file system is read-only: remount it writable or use another output.run_dir";
  if (what.find("lock") != std::string::npos) {
    return "Another process holds the checkpoint store's lock: stop the other writer";
  }
  return "Fix the cause above";
}

RestoredCheckpoint restore_checkpoint(const checkpoint::CheckpointStore& store,
                                      TrainingStrategy& strategy, std::optional<int64_t> index,
                                      const std::vector<CheckpointValidator>& validators) {
  RestoredCheckpoint out;
  LoadedCheckpoint loaded = load_checkpoint(store, index, &out.skipped);
  for (;;) {
    out.index = loaded.entry.index;
    for (const auto& validate : validators) {
      if (validate) validate(loaded);  // a refusal is final: no fallback
    }
    try {
      strategy.restore_state_files(loaded.files);
      check_restored_counters(loaded, strategy);
      return out;
    } catch (const DataError& e) {
      // Issue 15: verified files that do not decode, or counters that
      // disagree, fall back to the next older intact checkpoint (unless a
      // checkpoint was asked for by index).
      if (index) throw;
      out.skipped.push_back({loaded.entry.index, e.what()});
      std::optional<LoadedCheckpoint> older;
      const auto entries = store.list();
      for (auto it = entries.rbegin(); it != entries.rend() && !older; ++it) {
        if (it->index >= loaded.entry.index) continue;
        try {
          older = load_checkpoint(store, it->index);
        } catch (const DataError& f) {
          out.skipped.push_back({it->index, f.what()});
        }
      }
      if (!older) {
        std::string why;
        for (const auto& f : out.skipped) why += "\n  checkpoint " + std::to_string(f.index) + ": " + f.message;
        throw DataError(store.manifest_path().string() +
                        ": must list at least one checkpoint that restores, got none" + why);
      }
      loaded = std::move(*older);
    }
  }
}

CheckpointHook::CheckpointHook(std::shared_ptr<checkpoint::CheckpointStore> store,
                               CheckpointHookOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (!store_) throw std::invalid_argument("CheckpointHook needs a store, got null");
  if (options_.every_n_steps < 0) {
    throw ConfigError("`every_n_steps` must be >= 0, got " + std::to_string(options_.every_n_steps));
  }
  if (options_.every_n_epochs < 0) {
    throw ConfigError("`every_n_epochs` must be >= 0, got " + std::to_string(options_.every_n_epochs));
  }
}

bool CheckpointHook::runs_on_stage(TrainingStage stage) const {
  return stage == TrainingStage::SETUP || stage == TrainingStage::AFTER_BATCH;
}

void CheckpointHook::operator()(TrainContext& ctx, TrainingStage stage) {
  if (stage == TrainingStage::SETUP && ctx.strategy && !registered_) {
    ctx.strategy->add_boundary_callback(
        [this](TrainingStrategy& s, TrainingStrategy::Boundary b) { on_boundary(s, b); });
    registered_ = true;
  }
  if (stage != TrainingStage::AFTER_BATCH || !options_.on_signal) return;
  if (const int sig = g_signal.exchange(0)) {
    signal_received_ = true;
    signal_number_ = sig;
    if (ctx.strategy) ctx.strategy->request_stop();
  }
}

void CheckpointHook::on_boundary(TrainingStrategy& s, TrainingStrategy::Boundary b) {
  using B = TrainingStrategy::Boundary;
  if (s.global_rank != 0) return;  // data parallel: rank 0 alone writes
  bool due = false;
  switch (b) {
    case B::kBatch:
      due = options_.every_n_steps > 0 && s.step_count > 0 &&
            s.step_count % options_.every_n_steps == 0;
      break;
    case B::kEpoch:
      due = (options_.every_n_epochs > 0 && s.epoch_count % options_.every_n_epochs == 0) ||
            (options_.every_n_steps > 0 && s.step_count > 0 &&
             s.step_count % options_.every_n_steps == 0);
      break;
    case B::kEnd:
      due = options_.at_end;
      break;
    case B::kStop:
      due = true;  // stopped early (a signal here or on another worker, or request_stop)
      break;
  }
  if (!due || s.batch_count == last_saved_batch_) {
    // kEnd after a save at the same batch still needs the final state (the
    // final validation may have stepped a metric scheduler): save again.
    if (!(due && b == B::kEnd)) return;
  }
  try {
    auto extra = options_.extra_files;
    if (options_.dynamic_files) {
      for (auto& f : options_.dynamic_files()) extra.push_back(std::move(f));
    }
    written_.push_back(save_checkpoint(*store_, s, -1, options_.metric, extra));
  } catch (const std::exception& e) {
    const std::string advice = write_failure_advice(e);
    // The store writes a new folder and renames the manifest last: a failed
    // write leaves every earlier checkpoint as it was.
    const std::string kept = describe_newest_checkpoint(*store_);
    throw TrainingError("checkpoint at step " + std::to_string(s.step_count) + " could not be written to " +
                        store_->dir().string() + ": " + e.what() + "; earlier checkpoints are unchanged (" +
                        kept + "). " + advice + ", then resume from the run directory with --resume");
  }
  last_saved_batch_ = s.batch_count;
}

void CheckpointHook::simulate_signal(int sig) { g_signal.store(sig); }

void CheckpointHook::enter() {
  signal_received_ = false;
  signal_number_ = 0;
  g_signal.store(0);
  if (!options_.on_signal || handlers_installed_) return;
  struct sigaction sa {};
  sa.sa_handler = crucible_checkpoint_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  handlers_installed_ = true;
}

void CheckpointHook::exit(bool failed) {
  (void)failed;
  if (!handlers_installed_) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  handlers_installed_ = false;
}

}  // namespace crucible
