#pragma once
// The inference path's spline tables per layer, kept while the weights they
// were built from are unchanged (issue 48): MACE's radial MLPs
// (MaceImpl::radial_spline) and SchNet's filter networks
// (SchNetImpl::filter_spline).

#include "crucible/models/mace/radial_spline.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace crucible {

/// The splines' default: off when the environment sets
/// CRUCIBLE_RADIAL_SPLINE=0 (read once per process), else on. Never throws.
inline bool radial_splines_from_environment() {
  static const bool on = [] {
    const char* v = std::getenv("CRUCIBLE_RADIAL_SPLINE");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

/// What a table was built from: each weight's storage and version counter
/// (an in-place change bumps the version, a new tensor changes the
/// storage), then the table's dtype.
using SplineSignature = std::vector<std::pair<const void*, int64_t>>;

inline SplineSignature spline_signature(const std::vector<at::Tensor>& weights, at::ScalarType dtype) {
  SplineSignature s;
  for (const at::Tensor& w : weights) s.emplace_back(w.data_ptr(), w._version());
  s.emplace_back(nullptr, static_cast<int64_t>(dtype));
  return s;
}

/// `Cache` holds `splines` (vector of shared_ptr<const RadialSpline>),
/// `signatures` (vector of SplineSignature) and `mutex`. Layer t's table
/// of `num_layers`: the kept one when its signature is `signature`, else
/// build() (called under the lock) kept with it. Thread-safe; throws what
/// build() throws.
template <class Cache, class Build>
std::shared_ptr<const mace::RadialSpline> cached_spline(Cache& cache, size_t t, size_t num_layers,
                                                        const SplineSignature& signature, Build&& build) {
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (cache.splines.size() != num_layers) {
    cache.splines.assign(num_layers, nullptr);
    cache.signatures.assign(num_layers, {});
  }
  if (cache.splines[t] && cache.signatures[t] == signature) return cache.splines[t];
  cache.splines[t] = std::make_shared<const mace::RadialSpline>(build());
  cache.signatures[t] = signature;
  return cache.splines[t];
}

}  // namespace crucible
