#pragma once
// A training run built from its recipe (Config) before anything is written:
// data, normalization, model, loss, strategy with its update hooks. Used by
// `crucible train`, by resuming, and by load_training_from_checkpoint (seed
// 002 load_checkpoint: a strategy from a checkpoint plus runtime pieces).

#include "crucible/config/config.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/energy_model.h"
#include "crucible/training/best_model.h"
#include "crucible/training/checkpointing.h"
#include "crucible/training/ema.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"
#include "crucible/training/thread_choice.h"
#include "crucible/training/memory_estimate.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace crucible {

/// How many structures carry each label, and their atoms.
struct LabelCounts {
  int64_t energy = 0, forces = 0, stress = 0, atoms = 0;
};

/// The extxyz reader settings of a `data` section (label keys and units).
/// Never throws.
ExtxyzOptions extxyz_options(const DataConfig& data);

/// training.device text to a device: "cpu", "cuda", "cuda:N".
/// @throws ConfigError for other text, or CUDA on a build without it.
at::Device parse_device(const std::string& text);

/// Label counts of `structures`. Never throws.
LabelCounts count_labels(const std::vector<Structure>& structures);

/// Everything built from a Config. Move-only (owns the strategy).
struct TrainingSetup {
  Config config;                        ///< validated; data paths absolute.
  at::Device device = at::kCPU;         ///< training.device.
  at::ScalarType dtype = at::kFloat;    ///< parameter/positions dtype (precision or dtype).
  std::vector<Structure> train, valid;  ///< the split actually used.
  std::string split_text;               ///< how valid was chosen (for the header).
  LabelCounts train_labels, valid_labels;
  std::set<int64_t> elements;           ///< atomic numbers of the training set.
  std::vector<std::string> warnings;    ///< e.g. dropped loss terms, unseen elements.
  at::Tensor e0;                        ///< [119] float64 eV, index = Z (MACE E0s).
  std::string e0_source;                ///< where the E0s came from (data.e0s; model.json e0_source).
  /// model.json "origin" of the run's model: for a model.init_from whose
  /// source was imported (issue 46), the source's origin with
  /// "fine_tuned_from"; null otherwise.
  nlohmann::json origin;
  double scale = 1, shift = 0;          ///< eV, eV/atom (fit_energy_scale_shift).
  /// Closest pair of atoms within the cutoff in the training split, Å
  /// (infinity without pairs); model.json records half of it.
  double min_pair_distance = 0;
  /// The model.type architecture (crucible/models/registry.h), on `dtype`,
  /// normalization set, seeded by training.seed.
  std::shared_ptr<EnergyModel> model;
  int64_t num_parameters = 0;
  /// The estimated peak memory (checked against memory_available, the
  /// bytes free besides the process when the data was read; issue 47).
  MemoryEstimate memory;
  int64_t memory_available = 0;
  /// The CPU threads the run uses and why (training.num_threads; 0 = auto).
  ThreadChoice threads;
  std::vector<std::string> loss_terms;  ///< "energy", "forces", "stress" (those used).
  std::string loss_text;                ///< human-readable loss, for the header.
  std::shared_ptr<AtomicDataset> train_data, valid_data;
  std::unique_ptr<DataLoader> loader;   ///< shuffled by training.seed.
  std::unique_ptr<TrainingStrategy> strategy;  ///< update hooks registered; no I/O hooks.
  std::shared_ptr<SpikeSkippingHook> spike_hook;  ///< null unless spike_skipping.enabled.
  std::shared_ptr<EmaHook> ema_hook;              ///< null unless ema.enabled.
  std::shared_ptr<BestModelHook> best_hook;       ///< always registered.
  /// First epoch of training.stage_two as resolved for this run; unset = off.
  std::optional<int64_t> stage_two_start;
};

/// Builds a run from `config`: validates it, reads and splits the data
/// (resolve_data_path), fits E0 / scale / shift on the training split,
/// builds the model.type model (seeded with training.seed), the loss (terms with a weight
/// > 0 and labels), the strategy with its optimizer/scheduler and the
/// configured update hooks (accumulation, clipping, spike skipping, EMA),
/// then registers `hooks` in order. Writes nothing. Warnings go to
/// TrainingSetup::warnings.
/// With a `communicator` of more than one worker (issue 6): the loader is
/// sharded (DistributedSampler: num_replicas = size, rank, drop_last =
/// training.distributed.drop_last), the strategy averages gradients
/// (bucket_cap_mb) and shards validation; a "cuda" device becomes
/// cuda:<local_rank> when `local_rank` is given.
/// @throws ConfigError / DataError naming the key or file for bad input.
TrainingSetup build_training(const Config& config,
                             const std::vector<std::shared_ptr<Hook>>& hooks = {},
                             std::shared_ptr<Communicator> communicator = nullptr,
                             int local_rank = 0);

/// training.num_threads resolved and set (at::set_num_threads): a positive
/// value as given; 0 (auto) = OMP_NUM_THREADS where set, else on a CPU
/// device the faster of 1 and available_cpu_cores() / local_worker_count()
/// threads, measured with training_pass on the first `batch_size`
/// structures of `train` (on `device`, in `batch_dtype`); on other devices
/// that core count unmeasured. @throws what the model throws on the batch.
ThreadChoice resolve_thread_count(int64_t num_threads, const at::Device& device, EnergyModel& model,
                                  const AtomicDataset& train, int64_t batch_size, at::ScalarType batch_dtype);

/// Name of the file in every checkpoint `crucible train` writes that holds
/// the CPU threads the run used: {"cpu_threads": N}.
inline constexpr const char* kThreadsFile = "threads.json";

/// The CPU threads checkpoint `index` of `store` was written with
/// (kThreadsFile); nullopt for a checkpoint without that file (written
/// before it existed). @throws DataError naming the file if it is unreadable.
std::optional<int> checkpoint_thread_count(const checkpoint::CheckpointStore& store, int64_t index);

/// Name of the recipe file in every checkpoint `crucible train` writes: the
/// run's Config as a spec (config_to_spec_json).
inline constexpr const char* kRecipeFile = "recipe.json";

/// A validator (CheckpointValidator) that refuses a checkpoint whose
/// recipe.json differs from `config` in a key that matters
/// (recipe_differences), listing the differences; one without a
/// recipe.json is refused too.
/// @throws (the validator) ConfigError naming the checkpoint and the keys.
CheckpointValidator same_recipe_validator(const Config& config);

/// Runtime pieces a checkpoint does not hold (seed 002 load_checkpoint).
struct TrainingRuntime {
  std::vector<std::shared_ptr<Hook>> hooks;  ///< registered after the update hooks.
  std::optional<std::string> device;         ///< overrides training.device (map_location).
  /// Extra validators, run after same_models_validator on the loaded checkpoint.
  std::vector<CheckpointValidator> validators;
  std::shared_ptr<Communicator> communicator;  ///< data-parallel workers (null = one process).
  int local_rank = 0;                          ///< GPU index on this machine.
};

/// Loads a run from the checkpoint store at `checkpoint_dir`: checkpoint
/// `index` (unset = newest intact; `restored`, when given, receives the
/// index used and the damaged newer ones), its recipe.json rebuilt with
/// build_training, then same_models_validator and runtime.validators on
/// the loaded files, then the state restored. The result continues the run
/// at the exact next batch with strategy->run(*loader).
/// @throws DataError for a missing/damaged checkpoint or recipe (naming the
///   file), ConfigError for a bad recipe or device, whatever a validator throws.
TrainingSetup load_training_from_checkpoint(const std::filesystem::path& checkpoint_dir,
                                            const TrainingRuntime& runtime = {},
                                            std::optional<int64_t> index = std::nullopt,
                                            RestoredCheckpoint* restored = nullptr);

}  // namespace crucible
