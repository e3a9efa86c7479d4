#include "crucible/data/dataset.h"

#include <algorithm>

#include "crucible/common/error.h"

#include <cmath>
#include <random>
#include <stdexcept>

namespace crucible {

AtomicDataset::AtomicDataset(std::vector<Structure> structures, double cutoff)
    : structures_(std::move(structures)), cutoff_(cutoff) {
  if (!(cutoff > 0.0) || !std::isfinite(cutoff)) {
    throw std::invalid_argument("cutoff must be a finite positive number (Å), got " +
                                std::to_string(cutoff));
  }
  neighbor_lists_.reserve(structures_.size());
  for (const auto& s : structures_) {
    neighbor_lists_.push_back(build_neighbor_list(s.positions, s.cell, s.pbc, cutoff_));
  }
}

Batch AtomicDataset::collate(const std::vector<int64_t>& indices) const {
  std::vector<const Structure*> s;
  std::vector<const NeighborList*> nl;
  s.reserve(indices.size());
  nl.reserve(indices.size());
  for (int64_t i : indices) {
    s.push_back(&structures_.at(i));
    nl.push_back(&neighbor_lists_.at(i));
  }
  return crucible::collate(s, nl);
}

int64_t AtomicDataset::total_atoms() const {
  int64_t n = 0;
  for (const auto& s : structures_) n += s.num_atoms();
  return n;
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 rng(seed);
  // Fisher–Yates with our own bounded draw: std::uniform_int_distribution
  // differs between standard libraries, this does not.
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do {
      r = rng();
    } while (r >= limit);
    std::swap(p[i], p[static_cast<int64_t>(r % bound)]);
  }
  return p;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> random_split(int64_t n, double fraction,
                                                                   uint64_t seed) {
  if (!(fraction >= 0.0 && fraction < 1.0)) {
    throw ConfigError("data.valid_fraction must be in [0, 1), got " + std::to_string(fraction));
  }
  auto perm = seeded_permutation(n, seed);
  int64_t n_valid = static_cast<int64_t>(std::llround(fraction * static_cast<double>(n)));
  if (fraction > 0.0 && n >= 2 && n_valid == 0) n_valid = 1;
  if (n_valid >= n) n_valid = n - 1;
  std::vector<int64_t> valid(perm.begin(), perm.begin() + n_valid);
  std::vector<int64_t> train(perm.begin() + n_valid, perm.end());
  return {train, valid};
}

DataLoader::DataLoader(std::shared_ptr<const AtomicDataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (!dataset_ || dataset_->size() == 0) {
    throw ConfigError("data loader: dataset must contain at least one structure, got 0");
  }
  if (options_.batch_size < 1) {
    throw ConfigError("training.batch_size must be >= 1, got " +
                      std::to_string(options_.batch_size));
  }
  if (options_.num_replicas < 1 || options_.rank < 0 || options_.rank >= options_.num_replicas) {
    throw ConfigError("data loader: rank must be in [0, num_replicas) with num_replicas >= 1, got "
                      "rank " + std::to_string(options_.rank) + " of " +
                      std::to_string(options_.num_replicas));
  }
  if (options_.replay_begin >= 0 &&
      (options_.replay_begin > dataset_->size() || options_.replay_per_epoch < 0 ||
       options_.replay_per_epoch > dataset_->size() - options_.replay_begin ||
       epoch_size() == 0)) {
    throw ConfigError("data loader: the replay pool must be a non-empty tail of the dataset with "
                      "replay_per_epoch in [0, its size], got begin " + std::to_string(options_.replay_begin) +
                      ", " + std::to_string(options_.replay_per_epoch) + " per epoch of " +
                      std::to_string(dataset_->size()) + " structures");
  }
  if (num_samples() == 0) {
    throw ConfigError("training.distributed.drop_last leaves no training structures for each of " +
                      std::to_string(options_.num_replicas) + " workers (" +
                      std::to_string(dataset_->size()) + " structures): must be false, or use "
                      "fewer workers");
  }
}

int64_t DataLoader::epoch_size() const {
  return options_.replay_begin < 0 ? dataset_->size() : options_.replay_begin + options_.replay_per_epoch;
}

int64_t DataLoader::num_samples() const {
  const int64_t n = epoch_size();
  const int64_t r = options_.num_replicas;
  return (options_.sampler_drop_last && n % r != 0) ? n / r : (n + r - 1) / r;
}

int64_t DataLoader::size() const {
  const int64_t n = num_samples();
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void DataLoader::set_epoch_step(int64_t k) {
  if (k < 0 || k > size()) {
    throw std::out_of_range("set_epoch_step: k must be in [0, " + std::to_string(size()) +
                            "], got " + std::to_string(k));
  }
  start_step_ = k;
}

int64_t DataLoader::take_start_step() {
  const int64_t k = start_step_;
  start_step_ = 0;
  return k;
}

std::vector<int64_t> DataLoader::epoch_order() const {
  return shard_of(epoch_, epoch_ == offset_epoch_ ? offset_ : 0);
}

std::vector<int64_t> DataLoader::shard_of(int64_t epoch, int64_t skip) const {
  const int64_t n = epoch_size();
  // The epoch's structures: everything, or the primary ones and this
  // epoch's draw from the replay pool.
  std::vector<int64_t> members(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) members[static_cast<size_t>(i)] = i;
  if (options_.replay_begin >= 0 && options_.replay_per_epoch > 0) {
    const int64_t pool = dataset_->size() - options_.replay_begin;
    const std::vector<int64_t> draw =
        seeded_permutation(pool, (options_.seed + static_cast<uint64_t>(epoch)) ^ 0x9E3779B97F4A7C15ull);
    for (int64_t k = 0; k < options_.replay_per_epoch; ++k) {
      members[static_cast<size_t>(options_.replay_begin + k)] = options_.replay_begin + draw[static_cast<size_t>(k)];
    }
  }
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = seeded_permutation(n, options_.seed + static_cast<uint64_t>(epoch));
    for (auto& i : order) i = members[static_cast<size_t>(i)];
  } else {
    order = members;
  }
  order.erase(order.begin(), order.begin() + skip);
  const int64_t r = options_.num_replicas;
  if (r == 1) return order;
  // DistributedSampler: pad (repeating from the start) or cut to a multiple of r.
  const int64_t m = static_cast<int64_t>(order.size());
  if (m == 0) return order;
  const int64_t per_rank = (options_.sampler_drop_last && m % r != 0) ? m / r : (m + r - 1) / r;
  const int64_t total = per_rank * r;
  for (int64_t i = 0; static_cast<int64_t>(order.size()) < total; ++i) order.push_back(order[i]);
  order.resize(total);
  std::vector<int64_t> shard;
  shard.reserve(per_rank);
  for (int64_t i = options_.rank; i < total; i += r) shard.push_back(order[i]);
  return shard;
}

void DataLoader::set_resume_offset(int64_t epoch, int64_t consumed) {
  if (consumed < 0 || consumed > epoch_size()) {
    throw std::out_of_range("set_resume_offset: consumed must be in [0, " +
                            std::to_string(epoch_size()) + "], got " + std::to_string(consumed));
  }
  offset_epoch_ = epoch;
  offset_ = consumed;
}

int64_t DataLoader::first_batch(int64_t epoch) const {
  if (epoch != offset_epoch_ || offset_ == 0) return 0;
  const int64_t left = static_cast<int64_t>(shard_of(epoch, offset_).size());
  const int64_t b = options_.batch_size;
  const int64_t batches = options_.drop_last ? left / b : (left + b - 1) / b;
  return std::max<int64_t>(0, size() - batches);
}

std::vector<int64_t> DataLoader::batch_indices(int64_t k) const {
  if (k < 0 || k >= size()) {
    throw std::out_of_range("batch index must be in [0, " + std::to_string(size()) + "), got " +
                            std::to_string(k));
  }
  const auto order = epoch_order();
  const int64_t first = first_batch(epoch_);
  if (k < first) {
    throw std::out_of_range("batch " + std::to_string(k) + " of epoch " + std::to_string(epoch_) +
                            " was consumed before the resume (the epoch continues at batch " +
                            std::to_string(first) + ")");
  }
  const int64_t begin = (k - first) * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(order.size()));
  return {order.begin() + begin, order.begin() + end};
}

}  // namespace crucible
