#include "crucible/training/checkpointing.h"

#include "crucible/common/error.h"

#include <atomic>
#include <csignal>

namespace crucible {

namespace {

std::atomic<bool> g_signal{false};
struct sigaction g_old_int, g_old_term;

extern "C" void crucible_checkpoint_signal(int) { g_signal.store(true); }

}  // namespace

checkpoint::CheckpointEntry save_checkpoint(checkpoint::CheckpointStore& store,
                                            TrainingStrategy& strategy, int64_t index,
                                            const std::string& metric) {
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
  return store.save(index, counters, files, m);
}

RestoredCheckpoint restore_checkpoint(const checkpoint::CheckpointStore& store,
                                      TrainingStrategy& strategy, std::optional<int64_t> index) {
  RestoredCheckpoint out;
  if (index) {
    out.index = *index;
  } else {
    const auto intact = store.newest_intact();
    out.skipped = intact.failed;
    if (!intact.entry) {
      std::string why;
      for (const auto& f : intact.failed) why += "\n  checkpoint " + std::to_string(f.index) + ": " + f.message;
      throw DataError(store.manifest_path().string() +
                      ": must list at least one intact checkpoint, got none" + why);
    }
    out.index = intact.entry->index;
  }
  strategy.restore_state_files(store.load(out.index));
  return out;
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
  if (stage == TrainingStage::AFTER_BATCH && options_.on_signal && g_signal.exchange(false)) {
    signal_received_ = true;
    if (ctx.strategy) ctx.strategy->request_stop();
  }
}

void CheckpointHook::on_boundary(TrainingStrategy& s, TrainingStrategy::Boundary b) {
  using B = TrainingStrategy::Boundary;
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
      due = signal_received_;
      break;
  }
  if (!due || s.batch_count == last_saved_batch_) {
    // kEnd after a save at the same batch still needs the final state (the
    // final validation may have stepped a metric scheduler): save again.
    if (!(due && b == B::kEnd)) return;
  }
  written_.push_back(save_checkpoint(*store_, s, -1, options_.metric));
  last_saved_batch_ = s.batch_count;
}

void CheckpointHook::simulate_signal() { g_signal.store(true); }

void CheckpointHook::enter() {
  signal_received_ = false;
  g_signal.store(false);
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
