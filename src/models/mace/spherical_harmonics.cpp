// Real spherical harmonics, l <= 3, as explicit polynomials of the unit
// vector (x, y, z). See include/crucible/models/mace/spherical_harmonics.h.

#include "crucible/models/mace/spherical_harmonics.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace crucible::mace {

at::Tensor spherical_harmonics(const at::Tensor& vectors, int lmax, bool normalize) {
  if (!vectors.defined() || vectors.dim() != 2 || vectors.size(1) != 3 ||
      !at::isFloatingType(vectors.scalar_type())) {
    throw std::invalid_argument("spherical_harmonics: vectors must be a floating [E,3] tensor");
  }
  if (lmax < 0 || lmax > 3) {
    throw std::invalid_argument("spherical_harmonics: lmax must be in 0..3, got " + std::to_string(lmax));
  }
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
  const double pi = 3.14159265358979323846;
  const double c4pi = std::sqrt(4.0 * pi);  // component normalisation
  std::vector<at::Tensor> cols;
  cols.push_back(at::full_like(x, 0.5 * std::sqrt(1.0 / pi) * c4pi));
  if (lmax >= 1) {
    const double c = std::sqrt(3.0 / (4.0 * pi)) * c4pi;
    cols.insert(cols.end(), {c * y, c * z, c * x});
  }
  if (lmax >= 2) {
    const double a = 0.5 * std::sqrt(15.0 / pi) * c4pi;
    const double b = 0.25 * std::sqrt(5.0 / pi) * c4pi;
    const double d = 0.25 * std::sqrt(15.0 / pi) * c4pi;
    cols.insert(cols.end(), {a * x * y, a * y * z, b * (3.0 * z * z - 1.0), a * x * z,
                             d * (x * x - y * y)});
  }
  if (lmax >= 3) {
    const double c3 = 0.25 * std::sqrt(35.0 / (2.0 * pi)) * c4pi;
    const double c2 = 0.5 * std::sqrt(105.0 / pi) * c4pi;
    const double c1 = 0.25 * std::sqrt(21.0 / (2.0 * pi)) * c4pi;
    const double c0 = 0.25 * std::sqrt(7.0 / pi) * c4pi;
    const double c2b = 0.25 * std::sqrt(105.0 / pi) * c4pi;
    const at::Tensor z2 = z * z;
    cols.insert(cols.end(), {c3 * y * (3.0 * x * x - y * y), c2 * x * y * z,
                             c1 * y * (5.0 * z2 - 1.0), c0 * z * (5.0 * z2 - 3.0),
                             c1 * x * (5.0 * z2 - 1.0), c2b * z * (x * x - y * y),
                             c3 * x * (x * x - 3.0 * y * y)});
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
