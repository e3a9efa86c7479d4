// Stable counting sort. See include/crucible/neighbors/counting_sort.h.

#include "crucible/neighbors/counting_sort.h"
#include "../simd_clones.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace crucible {

int64_t counting_sort(const int64_t* keys, int64_t n, int64_t num_keys, int64_t* offsets, int64_t* order) {
  if (n < 0 || num_keys < 0) throw std::invalid_argument("counting_sort: n and num_keys must be >= 0");
  // Counts at offsets[k + 2], their prefix sums, then each item placed at
  // offsets[k + 1]++: that leaves offsets[k] = the first item of key k.
  std::fill(offsets, offsets + num_keys + 2, int64_t{0});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    if (k >= num_keys) {
      throw std::invalid_argument("counting_sort: item " + std::to_string(i) + " has key " + std::to_string(k) +
                                  ", expected a key below " + std::to_string(num_keys));
    }
    if (k >= 0) ++offsets[k + 2];
  }
  for (int64_t k = 2; k < num_keys + 2; ++k) offsets[k] += offsets[k - 1];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    if (k >= 0) order[offsets[k + 1]++] = i;
  }
  return offsets[num_keys];
}

KeyGroups counting_sort(const int64_t* keys, int64_t n, int64_t num_keys) {
  if (n < 0 || num_keys < 0) throw std::invalid_argument("counting_sort: n and num_keys must be >= 0");
  KeyGroups g;
  g.offsets.resize(static_cast<size_t>(num_keys + 2));
  g.order.resize(static_cast<size_t>(n));
  const int64_t kept = counting_sort(keys, n, num_keys, g.offsets.data(), g.order.data());
  g.offsets.pop_back();
  g.order.resize(static_cast<size_t>(kept));
  return g;
}

CRUCIBLE_SIMD_CLONES void rank_sort(const int32_t* in, int64_t k, int32_t* out) {
  for (int64_t i = 0; i < k; ++i) {
    const int32_t a = in[i];
    int32_t rank = 0;
    for (int64_t j = 0; j < i; ++j) rank += in[j] <= a ? 1 : 0;
    for (int64_t j = i; j < k; ++j) rank += in[j] < a ? 1 : 0;
    out[rank] = a;
  }
}

}  // namespace crucible
