#pragma once
// The inference path's spline tables per layer, kept while the weights they
// were built from are unchanged (issue 48): MACE's radial MLPs
// (MaceImpl::radial_spline) and SchNet's filter networks
// (SchNetImpl::filter_spline).

#include "crucible/models/mace/radial_spline.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
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

/// Per layer, the spline table of a model's inference path and the
/// signature of the weights it was built from. Thread-safe.
class SplineCache {
 public:
  /// Layer t's table of `num_layers`: the kept one when its signature is
  /// `signature`, else build() (called under the lock), kept with it.
  /// @throws std::out_of_range if t >= num_layers; what build() throws.
  std::shared_ptr<const mace::RadialSpline> get(size_t t, size_t num_layers, const SplineSignature& signature,
                                                const std::function<mace::RadialSpline()>& build) {
    if (t >= num_layers) throw std::out_of_range("SplineCache: layer " + std::to_string(t) + " of " +
                                                 std::to_string(num_layers));
    std::lock_guard<std::mutex> lock(mutex_);
    if (splines_.size() != num_layers) {
      splines_.assign(num_layers, nullptr);
      signatures_.assign(num_layers, {});
    }
    if (splines_[t] && signatures_[t] == signature) return splines_[t];
    splines_[t] = std::make_shared<const mace::RadialSpline>(build());
    signatures_[t] = signature;
    return splines_[t];
  }

 private:
  std::vector<std::shared_ptr<const mace::RadialSpline>> splines_;
  std::vector<SplineSignature> signatures_;
  std::mutex mutex_;
};

}  // namespace crucible
