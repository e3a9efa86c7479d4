// TrainingStrategy's seed-002 entry points for specs and checkpoints:
// to_spec / from_spec, save_checkpoint / restore_checkpoint / load_checkpoint
// (thin members over strategy_spec.h and checkpointing.h).

#include "crucible/common/error.h"
#include "crucible/training/checkpointing.h"
#include "crucible/training/strategy.h"
#include "crucible/training/strategy_spec.h"

namespace crucible {

std::string TrainingStrategy::to_spec() const { return strategy_options_to_spec(options_); }

std::unique_ptr<TrainingStrategy> TrainingStrategy::from_spec(
    const std::string& spec, std::map<std::string, std::shared_ptr<EnergyModel>> models,
    WeightedSumLoss loss, std::vector<std::shared_ptr<Hook>> hooks, NamedTrainingFn training_fn,
    const StrategyOptions& runtime) {
  return std::make_unique<TrainingStrategy>(std::move(models), strategy_options_from_spec(spec, runtime),
                                            std::move(loss), std::move(hooks),
                                            std::move(training_fn));
}

int64_t TrainingStrategy::save_checkpoint(const std::string& dir) {
  checkpoint::CheckpointStore store(dir);
  return crucible::save_checkpoint(store, *this).index;
}

int64_t TrainingStrategy::restore_checkpoint(const std::string& dir, std::optional<int64_t> index) {
  checkpoint::CheckpointStore store(dir);
  return crucible::restore_checkpoint(store, *this, index).index;
}

std::unique_ptr<TrainingStrategy> TrainingStrategy::load_checkpoint(
    const std::string& dir, std::map<std::string, std::shared_ptr<EnergyModel>> models,
    WeightedSumLoss loss, std::vector<std::shared_ptr<Hook>> hooks, NamedTrainingFn training_fn,
    const StrategyOptions& runtime, std::optional<int64_t> index) {
  checkpoint::CheckpointStore store(dir);
  const LoadedCheckpoint loaded = crucible::load_checkpoint(store, index);
  auto spec = loaded.files.find(kStrategySpecFile);
  if (spec == loaded.files.end()) {
    throw DataError(dir + ": checkpoint " + std::to_string(loaded.entry.index) + " must contain " +
                    kStrategySpecFile + " (written by save_checkpoint), got no such file");
  }
  auto strategy = from_spec(spec->second, std::move(models), std::move(loss), std::move(hooks),
                            std::move(training_fn), runtime);
  strategy->restore_state_files(loaded.files);
  return strategy;
}

}  // namespace crucible
