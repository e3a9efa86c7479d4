#pragma once
// Stable counting sort of items by a small integer key: how edges are
// grouped by atom or by pair, and atoms by hop count.

#include <cstdint>
#include <vector>

namespace crucible {

/// Items grouped by key: the items with key k are
/// order[offsets[k] .. offsets[k+1]), in increasing item index.
struct KeyGroups {
  std::vector<int64_t> offsets;  ///< [num_keys + 1]; offsets[num_keys] = items kept.
  std::vector<int64_t> order;    ///< [items kept]: item indices sorted by key (stable).
};

/// Stable counting sort (Knuth, TAOCP vol. 3, §5.2, "distribution
/// counting") of items 0 .. n-1 by keys[i]: O(n + num_keys), serial.
///
/// @param keys     [n] int64: keys[i] in [0, num_keys) groups item i; a
///                 negative key leaves item i out of `order`.
/// @param n        number of items, >= 0.
/// @param num_keys number of groups, >= 0.
/// @throws std::invalid_argument if a key is >= num_keys, naming the item
///         and the key.
KeyGroups counting_sort(const int64_t* keys, int64_t n, int64_t num_keys);

}  // namespace crucible
