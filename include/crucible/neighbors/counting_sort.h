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

/// The same sort written into the caller's buffers (no allocation), for
/// results that live in tensors (group_edges_by_pair); the form above is
/// built on it.
///
/// @param offsets [num_keys + 2] int64, any contents on entry; on return
///                offsets[0 .. num_keys] are KeyGroups::offsets (the last
///                entry is scratch).
/// @param order   [n] int64; on return its first `kept` entries are
///                KeyGroups::order.
/// @returns kept, the number of items with a key >= 0.
/// @throws std::invalid_argument as counting_sort above.
int64_t counting_sort(const int64_t* keys, int64_t n, int64_t num_keys, int64_t* offsets, int64_t* order);

/// The longest input rank_sort is meant for (k² compares).
constexpr int64_t kRankSortMaxItems = 256;

/// out[0, k) = in[0, k) in ascending order (a neighbor list's indices):
/// each value goes to its rank, the count of the values below it plus the
/// equal ones before it. k² compares without a branch, vectorised (AVX2 /
/// AVX-512 clones): for tens of values 2-3x faster than std::sort, whose
/// compares mispredict on unsorted input. `in` and `out` must not overlap.
/// Never throws.
void rank_sort(const int32_t* in, int64_t k, int32_t* out);

}  // namespace crucible
