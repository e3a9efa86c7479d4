// Issue 6: DataLoader sharding with PyTorch DistributedSampler's meaning,
// checked against torch.utils.data.DistributedSampler (shuffle=False gives
// its exact index lists) and, with shuffling, for disjointness and coverage.

#include "common/python_oracle.h"
#include "crucible/common/error.h"
#include "crucible/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace crucible {
namespace {

std::shared_ptr<AtomicDataset> dimers(int n) {
  std::vector<Structure> v;
  for (int i = 0; i < n; ++i) {
    Structure s;
    s.positions = at::tensor({0.0, 0.0, 0.0, 1.0 + 0.01 * i, 0.0, 0.0}, at::kDouble).view({2, 3});
    s.atomic_numbers = at::full({2}, 1, at::kLong);
    s.cell = at::zeros({3, 3}, at::kDouble);
    v.push_back(s);
  }
  return std::make_shared<AtomicDataset>(v, 2.0);
}

std::vector<int64_t> shard(const std::shared_ptr<AtomicDataset>& ds, int64_t r, int64_t rank,
                           bool drop_last, bool shuffle, int64_t epoch = 0) {
  DataLoaderOptions o;
  o.batch_size = 2;
  o.shuffle = shuffle;
  o.seed = 11;
  o.num_replicas = r;
  o.rank = rank;
  o.sampler_drop_last = drop_last;
  DataLoader loader(ds, o);
  loader.set_epoch(epoch);
  return loader.epoch_order();
}

TEST(DistributedSampler, UnshuffledShardsEqualPyTorchs) {
  if (!testing::python_has("torch")) GTEST_SKIP() << "python3-torch missing";
  // One oracle run: a line per (n, replicas, drop_last, rank).
  const std::string script =
      "-c \"from torch.utils.data import DistributedSampler as S\n"
      "for n in (10, 11, 7):\n"
      "  for r in (2, 3, 4):\n"
      "    for d in (False, True):\n"
      "      for k in range(r): print(' '.join(str(i) for i in S(range(n), num_replicas=r, "
      "rank=k, shuffle=False, drop_last=d)))\"";
  std::istringstream oracle(testing::run_python(script));
  for (int n : {10, 11, 7}) {
    auto ds = dimers(n);
    for (int r : {2, 3, 4}) {
      for (bool drop : {false, true}) {
        for (int k = 0; k < r; ++k) {
          std::string line;
          ASSERT_TRUE(std::getline(oracle, line)) << "oracle output ended at n=" << n << " r=" << r;
          std::istringstream is(line);
          std::vector<int64_t> want;
          for (int64_t x; is >> x;) want.push_back(x);
          EXPECT_EQ(shard(ds, r, k, drop, false), want)
              << "n=" << n << " replicas=" << r << " rank=" << k << " drop_last=" << drop;
        }
      }
    }
  }
}

TEST(DistributedSampler, ShuffledShardsAreDisjointCoverTheEpochAndReshuffleBySetEpoch) {
  auto ds = dimers(10);
  for (int64_t epoch : {0, 1}) {
    std::vector<int64_t> all;
    for (int64_t k = 0; k < 3; ++k) {
      auto s = shard(ds, 3, k, /*drop_last=*/false, /*shuffle=*/true, epoch);
      EXPECT_EQ(s.size(), 4u);  // ceil(10/3), padded with the order's first index
      all.insert(all.end(), s.begin(), s.end());
    }
    std::set<int64_t> unique(all.begin(), all.end());
    EXPECT_EQ(unique.size(), 10u) << "every structure in some shard";
    EXPECT_EQ(all.size(), 12u) << "2 padding entries";
    // Interleaving the shards gives back the (padded) global order.
    DataLoaderOptions one;
    one.batch_size = 2;
    one.seed = 11;
    DataLoader single(ds, one);
    single.set_epoch(epoch);
    const auto order = single.epoch_order();
    for (int64_t k = 0; k < 3; ++k) {
      const auto s = shard(ds, 3, k, false, true, epoch);
      for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i], order[(i * 3 + k) % 10]);
    }
  }
  EXPECT_NE(shard(ds, 2, 0, false, true, 0), shard(ds, 2, 0, false, true, 1));
  // drop_last: 3 each, disjoint, one structure left out.
  std::set<int64_t> seen;
  for (int64_t k = 0; k < 3; ++k) {
    auto s = shard(ds, 3, k, true, true);
    EXPECT_EQ(s.size(), 3u);
    for (auto i : s) EXPECT_TRUE(seen.insert(i).second) << "index " << i << " twice";
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST(DistributedSampler, BatchesAndErrors) {
  auto ds = dimers(10);
  DataLoaderOptions o;
  o.batch_size = 2;
  o.num_replicas = 3;
  o.rank = 1;
  DataLoader loader(ds, o);
  EXPECT_EQ(loader.num_samples(), 4);
  EXPECT_EQ(loader.size(), 2);
  o.rank = 3;
  EXPECT_THROW(DataLoader(ds, o), ConfigError);
  o.rank = 0;
  o.num_replicas = 11;
  o.sampler_drop_last = true;
  EXPECT_THROW(DataLoader(ds, o), ConfigError);  // 10 structures, 11 workers, no padding
}

// Issue 18 (training.replay): each epoch holds every primary structure once
// and replay_per_epoch distinct ones from the pool, drawn anew per epoch
// and the same for the same seed and epoch (exact resume).
TEST(ReplayPool, EveryEpochHasThePrimarySetAndADrawFromThePool) {
  const auto ds = dimers(30);  // 0..19 primary, 20..29 the pool
  DataLoaderOptions o;
  o.batch_size = 4;
  o.seed = 5;
  o.replay_begin = 20;
  o.replay_per_epoch = 4;
  DataLoader loader(ds, o);
  EXPECT_EQ(loader.epoch_size(), 24);
  EXPECT_EQ(loader.size(), 6);
  std::set<std::vector<int64_t>> draws;
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    loader.set_epoch(epoch);
    const auto order = loader.epoch_order();
    ASSERT_EQ(order.size(), 24u);
    std::vector<int64_t> primary, pool;
    for (int64_t i : order) (i < 20 ? primary : pool).push_back(i);
    std::sort(primary.begin(), primary.end());
    std::sort(pool.begin(), pool.end());
    for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(primary[static_cast<size_t>(i)], i);
    ASSERT_EQ(pool.size(), 4u);
    EXPECT_EQ(std::set<int64_t>(pool.begin(), pool.end()).size(), 4u);  // without replacement
    for (int64_t i : pool) EXPECT_GE(i, 20);
    draws.insert(pool);
    DataLoader again(ds, o);
    again.set_epoch(epoch);
    EXPECT_EQ(again.epoch_order(), order);
  }
  EXPECT_GT(draws.size(), 3u);  // the draw changes between epochs
  o.replay_per_epoch = 11;
  EXPECT_THROW(DataLoader(ds, o), ConfigError);
}

}  // namespace
}  // namespace crucible
