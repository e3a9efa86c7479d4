// Real spherical harmonics, l <= 3, as explicit polynomials of the unit
// vector (x, y, z). See include/crucible/models/mace/spherical_harmonics.h.

#include "crucible/models/mace/spherical_harmonics.h"
#include "harmonic_constants.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace crucible::mace {

at::Tensor spherical_harmonics(const at::Tensor& vectors, int lmax, bool normalize) {
  detail::check_harmonics_arguments("spherical_harmonics", vectors, lmax);
  at::Tensor u = vectors;
  at::Tensor positive;
  if (normalize) {
    const at::Tensor sq = vectors.pow(2).sum(1, /*keepdim=*/true);
    positive = sq > 0;
    // Gradient-safe norm: no 1/0 for a zero row (its harmonics are 0 for l >= 1).
    const at::Tensor norm = at::where(positive, sq, at::ones_like(sq)).sqrt();
    u = at::where(positive, vectors / norm, at::zeros_like(vectors));
  }
  const at::Tensor x = u.select(1, 0), y = u.select(1, 1), z = u.select(1, 2);
  const detail::HarmonicConstants k = detail::harmonic_constants();
  std::vector<at::Tensor> cols;
  cols.push_back(at::full_like(x, k.k00));
  if (lmax >= 1) cols.insert(cols.end(), {k.k1 * y, k.k1 * z, k.k1 * x});
  if (lmax >= 2) {
    cols.insert(cols.end(), {k.k2a * x * y, k.k2a * y * z, k.k2b * (3.0 * z * z - 1.0), k.k2a * x * z,
                             k.k2d * (x * x - y * y)});
  }
  if (lmax >= 3) {
    const at::Tensor z2 = z * z;
    cols.insert(cols.end(), {k.k3c3 * y * (3.0 * x * x - y * y), k.k3c2 * x * y * z,
                             k.k3c1 * y * (5.0 * z2 - 1.0), k.k3c0 * z * (5.0 * z2 - 3.0),
                             k.k3c1 * x * (5.0 * z2 - 1.0), k.k3c2b * z * (x * x - y * y),
                             k.k3c3 * x * (x * x - 3.0 * y * y)});
  }
  at::Tensor out = at::stack(cols, 1);
  if (positive.defined() && lmax >= 1) {
    // A zero row has no direction: its l >= 1 harmonics are 0 (not the
    // constant terms of e.g. 3z² - 1).
    out = at::cat({out.narrow(1, 0, 1), at::where(positive, out.narrow(1, 1, out.size(1) - 1),
                                                  at::zeros_like(out.narrow(1, 1, out.size(1) - 1)))},
                1);
  }
  return out;
}

}  // namespace crucible::mace
