// Radial basis of MACE (Batatia et al., NeurIPS 2022, arXiv 2206.07697,
// section 3: "8 Bessel basis functions and a polynomial envelope, p = 5").

#include "crucible/models/mace/radial.h"

#include <cmath>
#include <stdexcept>

namespace crucible::mace {
namespace {
constexpr double kPi = 3.14159265358979323846;
}

at::Tensor bessel_basis(const at::Tensor& r, double r_max, int64_t num_basis) {
  if (!(r_max > 0.0)) throw std::invalid_argument("bessel_basis: r_max must be > 0");
  if (num_basis < 1) throw std::invalid_argument("bessel_basis: num_basis must be >= 1");
  const at::Tensor n = at::arange(1, num_basis + 1, r.options()) * (kPi / r_max);  // [K]
  const at::Tensor rr = r.unsqueeze(-1);                                            // [E,1]
  const double prefactor = std::sqrt(2.0 / r_max);
  // sin(n π r / r_max) / r, with the r → 0 limit n π / r_max.
  const at::Tensor safe = at::where(rr > 0, rr, at::ones_like(rr));
  const at::Tensor value = at::sin(n * rr) / safe;
  return prefactor * at::where(rr > 0, value, n.expand_as(value));
}

at::Tensor bessel_basis(const at::Tensor& r, const at::Tensor& frequencies, const at::Tensor& prefactor) {
  if (!frequencies.defined() || frequencies.dim() != 1) throw std::invalid_argument("bessel_basis: frequencies must be 1-D");
  if (!prefactor.defined() || prefactor.numel() != 1) throw std::invalid_argument("bessel_basis: prefactor must be one value");
  const at::Tensor n = frequencies.to(r.options());
  const at::Tensor rr = r.unsqueeze(-1);
  const at::Tensor safe = at::where(rr > 0, rr, at::ones_like(rr));
  const at::Tensor value = at::sin(n * rr) / safe;
  return prefactor.to(r.options()).reshape({}) * at::where(rr > 0, value, n.expand_as(value));
}

at::Tensor polynomial_cutoff(const at::Tensor& r, double r_max, int64_t p) {
  if (!(r_max > 0.0)) throw std::invalid_argument("polynomial_cutoff: r_max must be > 0");
  return polynomial_envelope(r / r_max, p);
}

at::Tensor polynomial_envelope(const at::Tensor& x, int64_t p) {
  if (p < 1) throw std::invalid_argument("polynomial_envelope: p must be >= 1");
  const double pd = static_cast<double>(p);
  const at::Tensor xp = at::pow(x, pd);
  const at::Tensor f = 1.0 - 0.5 * (pd + 1.0) * (pd + 2.0) * xp + pd * (pd + 2.0) * xp * x -
                       0.5 * pd * (pd + 1.0) * xp * x * x;
  return f * (x < 1.0).to(x.scalar_type());
}

double normalized_silu_factor() {
  static const double factor = [] {
    // ∫ silu(z)² φ(z) dz by the trapezoidal rule (spectrally accurate for
    // this smooth, rapidly decaying integrand).
    const int n = 24000;
    const double a = -12.0, h = 24.0 / n;
    double sum = 0.0;
    for (int k = 0; k <= n; ++k) {
      const double z = a + h * k;
      const double s = z / (1.0 + std::exp(-z));
      const double w = (k == 0 || k == n) ? 0.5 : 1.0;
      sum += w * s * s * std::exp(-0.5 * z * z);
    }
    const double second_moment = sum * h / std::sqrt(2.0 * kPi);
    return 1.0 / std::sqrt(second_moment);
  }();
  return factor;
}

at::Tensor radial_embedding(const at::Tensor& r, double cutoff, int64_t num_bessel, int64_t p,
                            const at::Tensor& frequencies, const at::Tensor& prefactor, const at::Tensor& r_max) {
  if (frequencies.defined() && prefactor.defined() && r_max.defined()) {
    return bessel_basis(r, frequencies.to(r.options()), prefactor.to(r.options())) *
           polynomial_envelope(r / r_max.to(r.options()), p).unsqueeze(-1);
  }
  return bessel_basis(r, cutoff, num_bessel) * polynomial_cutoff(r, cutoff, p).unsqueeze(-1);
}

}  // namespace crucible::mace
