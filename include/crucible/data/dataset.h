#pragma once
// In-memory dataset of structures with neighbor lists cached at one cutoff.

#include "crucible/data/batch.h"
#include "crucible/data/extxyz.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crucible {

/// Structures plus their neighbor lists at `cutoff` (built once: structures
/// do not move between epochs).
class AtomicDataset {
 public:
  /// Builds neighbor lists for every structure. @throws std::invalid_argument
  /// if cutoff <= 0.
  AtomicDataset(std::vector<Structure> structures, double cutoff);

  int64_t size() const { return static_cast<int64_t>(structures_.size()); }
  double cutoff() const { return cutoff_; }
  const Structure& structure(int64_t i) const { return structures_.at(i); }
  const NeighborList& neighbor_list(int64_t i) const { return neighbor_lists_.at(i); }
  const std::vector<Structure>& structures() const { return structures_; }
  /// Collates the structures at `indices` (float64, CPU).
  Batch collate(const std::vector<int64_t>& indices) const;
  /// Total number of atoms over all structures.
  int64_t total_atoms() const;

 private:
  std::vector<Structure> structures_;
  std::vector<NeighborList> neighbor_lists_;
  double cutoff_;
};

/// Splits indices 0..n-1 into (train, validation) with a seeded shuffle;
/// validation gets round(fraction * n) structures (at least 1 when
/// 0 < fraction and n >= 2). @throws ConfigError if fraction not in [0, 1).
std::pair<std::vector<int64_t>, std::vector<int64_t>> random_split(int64_t n, double fraction,
                                                                   uint64_t seed);

/// Deterministic permutation of 0..n-1 from `seed` (Fisher–Yates with
/// std::mt19937_64; identical on every platform).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

/// Options of DataLoader (defaults inline).
struct DataLoaderOptions {
  int64_t batch_size = 8;  ///< structures per batch, >= 1. Default 8.
  bool shuffle = true;     ///< reshuffle every epoch. Default true.
  uint64_t seed = 0;       ///< shuffle seed; epoch e uses seed + e. Default 0.
  bool drop_last = false;  ///< drop the last incomplete batch. Default false.
  /// Data parallelism (PyTorch DistributedSampler meaning): the epoch's
  /// shuffled order (identical on every rank: same seed + epoch) is padded
  /// by repeating its first indices to a multiple of num_replicas, or, with
  /// sampler_drop_last, cut to one; rank r takes every num_replicas-th index
  /// from position r. Shards are disjoint apart from the padding. Defaults
  /// 1 / 0 / false (no sharding).
  int64_t num_replicas = 1;
  int64_t rank = 0;                ///< in [0, num_replicas).
  bool sampler_drop_last = false;
  /// Replay (issue 18, training.replay): dataset indices >= replay_begin
  /// are a pool of which each epoch takes replay_per_epoch, drawn without
  /// replacement with seed + epoch (a different stream from the shuffle),
  /// next to every index < replay_begin. -1 (default) = no pool: every
  /// structure every epoch.
  int64_t replay_begin = -1;
  int64_t replay_per_epoch = 0;    ///< in [0, dataset size - replay_begin].
};

/// Iterates a dataset in batches, with PyTorch DataLoader semantics plus
/// deterministic per-epoch shuffles and mid-epoch restart.
class DataLoader {
 public:
  /// @throws ConfigError if batch_size < 1, the dataset is empty,
  ///   num_replicas < 1, rank outside [0, num_replicas), or sampler_drop_last
  ///   leaves a rank without structures.
  DataLoader(std::shared_ptr<const AtomicDataset> dataset, DataLoaderOptions options);

  /// Batches per epoch of this rank (len(dataloader)).
  int64_t size() const;
  /// Structures per epoch of this rank (len(DistributedSampler)).
  int64_t num_samples() const;
  /// Structures per epoch over all ranks: the dataset size, or with a replay
  /// pool replay_begin + replay_per_epoch.
  int64_t epoch_size() const;
  /// Selects the epoch whose shuffle order the next iteration uses.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  /// The next iteration starts at batch k of the epoch (one-shot: reset to 0
  /// after an iteration is started). @throws std::out_of_range if k > size().
  void set_epoch_step(int64_t k);
  int64_t epoch() const { return epoch_; }
  /// Dataset indices of this rank, in the order of the current epoch
  /// ([num_samples()]).
  std::vector<int64_t> epoch_order() const;
  /// Dataset indices of batch k of the current epoch.
  std::vector<int64_t> batch_indices(int64_t k) const;
  /// Batch k of the current epoch (float64, CPU).
  Batch batch(int64_t k) const { return dataset_->collate(batch_indices(k)); }
  const AtomicDataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  /// Takes (and resets) the start batch set by set_epoch_step.
  int64_t take_start_step();
  /// Resume after a world-size change (issue 6): in epoch `epoch`, the
  /// first `consumed` structures of the epoch's global order were already
  /// trained on (by any number of workers). That epoch then shards only the
  /// rest (padded / cut for num_replicas as usual) into its last batches:
  /// batches first_batch(epoch) .. size()-1. Other epochs are unaffected.
  /// @throws std::out_of_range if consumed is outside [0, dataset size].
  void set_resume_offset(int64_t epoch, int64_t consumed);
  /// The first batch index of `epoch` (0 unless set_resume_offset shortened it).
  int64_t first_batch(int64_t epoch) const;

 private:
  std::shared_ptr<const AtomicDataset> dataset_;
  DataLoaderOptions options_;
  /// This rank's indices of `epoch` after skipping `skip` of its global order.
  std::vector<int64_t> shard_of(int64_t epoch, int64_t skip) const;
  int64_t epoch_ = 0;
  int64_t start_step_ = 0;
  int64_t offset_epoch_ = -1;  ///< epoch shortened by set_resume_offset (-1 = none).
  int64_t offset_ = 0;
};

}  // namespace crucible
