// counting_sort against std::stable_sort of the kept items by key;
// rank_sort against std::sort.

#include "crucible/neighbors/counting_sort.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

namespace crucible {
namespace {

TEST(CountingSort, MatchesStableSortAndLeavesOutNegativeKeys) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> key(-2, 9);  // -2, -1: left out; 9 keys, some empty
  std::vector<int64_t> keys(1000);
  for (auto& k : keys) k = key(rng);
  const KeyGroups g = counting_sort(keys.data(), static_cast<int64_t>(keys.size()), 10);

  std::vector<int64_t> expected;
  for (int64_t i = 0; i < static_cast<int64_t>(keys.size()); ++i) {
    if (keys[static_cast<size_t>(i)] >= 0) expected.push_back(i);
  }
  std::stable_sort(expected.begin(), expected.end(),
                   [&](int64_t a, int64_t b) { return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)]; });
  EXPECT_EQ(g.order, expected);
  ASSERT_EQ(g.offsets.size(), 11u);
  EXPECT_EQ(g.offsets.front(), 0);
  EXPECT_EQ(g.offsets.back(), static_cast<int64_t>(expected.size()));
  for (int64_t k = 0; k < 10; ++k) {
    const auto count = std::count(keys.begin(), keys.end(), k);
    EXPECT_EQ(g.offsets[static_cast<size_t>(k + 1)] - g.offsets[static_cast<size_t>(k)], count) << "key " << k;
    for (int64_t q = g.offsets[static_cast<size_t>(k)]; q < g.offsets[static_cast<size_t>(k + 1)]; ++q) {
      EXPECT_EQ(keys[static_cast<size_t>(g.order[static_cast<size_t>(q)])], k);
    }
  }
}

TEST(CountingSort, EmptyInputAndKeyOutOfRange) {
  const KeyGroups none = counting_sort(nullptr, 0, 3);
  EXPECT_EQ(none.offsets, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_TRUE(none.order.empty());
  const std::vector<int64_t> keys{0, 3, 1};
  try {
    counting_sort(keys.data(), 3, 3);
    FAIL() << "a key of 3 with 3 keys must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("item 1 has key 3"), std::string::npos) << e.what();
  }
}

TEST(RankSort, MatchesStdSortWithDuplicatesAtEveryLengthUpToTheLimit) {
  std::mt19937 rng(11);
  for (int64_t k = 0; k <= kRankSortMaxItems; k += (k < 40 ? 1 : 23)) {
    // Narrow ranges give duplicates; wide ones a neighbor list's spread.
    for (const int32_t range : {3, 1000, 2000000000}) {
      std::uniform_int_distribution<int32_t> value(-range / 2, range / 2);
      std::vector<int32_t> in(static_cast<size_t>(k)), out(static_cast<size_t>(k), -7);
      for (auto& v : in) v = value(rng);
      rank_sort(in.data(), k, out.data());
      std::vector<int32_t> want = in;
      std::sort(want.begin(), want.end());
      EXPECT_EQ(out, want) << "k " << k << " range " << range;
    }
  }
}

}  // namespace
}  // namespace crucible
