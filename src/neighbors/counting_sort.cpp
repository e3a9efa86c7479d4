// Stable counting sort. See include/crucible/neighbors/counting_sort.h.

#include "crucible/neighbors/counting_sort.h"
#include "../simd_clones.h"

#include <stdexcept>
#include <string>

namespace crucible {

KeyGroups counting_sort(const int64_t* keys, int64_t n, int64_t num_keys) {
  if (n < 0 || num_keys < 0) throw std::invalid_argument("counting_sort: n and num_keys must be >= 0");
  KeyGroups g;
  g.offsets.assign(static_cast<size_t>(num_keys + 1), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    if (k >= num_keys) {
      throw std::invalid_argument("counting_sort: item " + std::to_string(i) + " has key " + std::to_string(k) +
                                  ", expected a key below " + std::to_string(num_keys));
    }
    if (k >= 0) ++g.offsets[static_cast<size_t>(k + 1)];
  }
  for (int64_t k = 0; k < num_keys; ++k) g.offsets[static_cast<size_t>(k + 1)] += g.offsets[static_cast<size_t>(k)];
  g.order.resize(static_cast<size_t>(g.offsets.back()));
  std::vector<int64_t> next(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    if (k >= 0) g.order[static_cast<size_t>(next[static_cast<size_t>(k)]++)] = i;
  }
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
