// Clebsch-Gordan coefficients (Racah's formula) and real-basis couplings.
// See include/crucible/models/mace/clebsch_gordan.h.

#include "crucible/models/mace/clebsch_gordan.h"

#include <c10/util/complex.h>

#include <cmath>
#include <complex>
#include <stdexcept>
#include <string>
#include <vector>

namespace crucible::mace {

namespace {

double factorial(int n) {
  double f = 1.0;
  for (int i = 2; i <= n; ++i) f *= i;
  return f;
}

void check_l(int l) {
  if (l < 0 || l > 8) throw std::invalid_argument("Clebsch-Gordan: l must be in 0..8, got " + std::to_string(l));
}

bool triangle(int l1, int l2, int l3) { return l3 >= std::abs(l1 - l2) && l3 <= l1 + l2; }

/// ⟨j1 m1 j2 m2 | J M⟩ for integer angular momenta.
double cg(int j1, int m1, int j2, int m2, int J, int M) {
  if (M != m1 + m2 || !triangle(j1, j2, J)) return 0.0;
  if (std::abs(m1) > j1 || std::abs(m2) > j2 || std::abs(M) > J) return 0.0;
  const double pre = std::sqrt((2.0 * J + 1.0) * factorial(J + j1 - j2) * factorial(J - j1 + j2) *
                               factorial(j1 + j2 - J) / factorial(j1 + j2 + J + 1));
  const double norm = std::sqrt(factorial(J + M) * factorial(J - M) * factorial(j1 - m1) *
                                factorial(j1 + m1) * factorial(j2 - m2) * factorial(j2 + m2));
  double sum = 0.0;
  for (int k = 0; k <= j1 + j2 - J; ++k) {
    const int a = j1 + j2 - J - k, b = j1 - m1 - k, c = j2 + m2 - k, d = J - j2 + m1 + k,
              e = J - j1 - m2 + k;
    if (a < 0 || b < 0 || c < 0 || d < 0 || e < 0) continue;
    sum += (k % 2 ? -1.0 : 1.0) /
           (factorial(k) * factorial(a) * factorial(b) * factorial(c) * factorial(d) * factorial(e));
  }
  return pre * norm * sum;
}

/// U_l[real m, complex m'] with Y_real = U Y_complex (see spherical_harmonics.h).
std::vector<std::complex<double>> change_of_basis(int l) {
  const int n = 2 * l + 1;
  std::vector<std::complex<double>> u(static_cast<size_t>(n * n), 0.0);
  auto at = [&](int m_real, int m_complex) -> std::complex<double>& {
    return u[static_cast<size_t>((m_real + l) * n + (m_complex + l))];
  };
  const double s = 1.0 / std::sqrt(2.0);
  at(0, 0) = 1.0;
  for (int m = 1; m <= l; ++m) {
    const double sign = m % 2 ? -1.0 : 1.0;
    at(m, m) = sign * s;                                          // Y_m = (-1)^m Y^m + Y^-m, / √2
    at(m, -m) = s;
    at(-m, -m) = std::complex<double>(0.0, s);                    // Y_-m = i (Y^-m - (-1)^m Y^m) / √2
    at(-m, m) = std::complex<double>(0.0, -sign * s);
  }
  return u;
}

}  // namespace

at::Tensor clebsch_gordan(int l1, int l2, int l3) {
  check_l(l1);
  check_l(l2);
  check_l(l3);
  at::Tensor out = at::zeros({2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1}, at::kDouble);
  auto a = out.accessor<double, 3>();
  for (int m1 = -l1; m1 <= l1; ++m1) {
    for (int m2 = -l2; m2 <= l2; ++m2) {
      const int m3 = m1 + m2;
      if (std::abs(m3) <= l3) a[m1 + l1][m2 + l2][m3 + l3] = cg(l1, m1, l2, m2, l3, m3);
    }
  }
  return out;
}

at::Tensor real_coupling(int l1, int l2, int l3) {
  const at::Tensor c = clebsch_gordan(l1, l2, l3);
  const int n1 = 2 * l1 + 1, n2 = 2 * l2 + 1, n3 = 2 * l3 + 1;
  if (!triangle(l1, l2, l3)) return at::zeros({n1, n2, n3}, at::kDouble);
  const auto u1 = change_of_basis(l1), u2 = change_of_basis(l2), u3 = change_of_basis(l3);
  auto ca = c.accessor<double, 3>();
  std::vector<std::complex<double>> r(static_cast<size_t>(n1 * n2 * n3), 0.0);
  // C_real[i,j,k] = Σ U3[k,M] CG[m1,m2,M] conj(U1[i,m1]) conj(U2[j,m2]).
  for (int i = 0; i < n1; ++i)
    for (int j = 0; j < n2; ++j)
      for (int k = 0; k < n3; ++k) {
        std::complex<double> acc = 0.0;
        for (int p = 0; p < n1; ++p)
          for (int q = 0; q < n2; ++q)
            for (int s = 0; s < n3; ++s) {
              const double g = ca[p][q][s];
              if (g == 0.0) continue;
              acc += u3[static_cast<size_t>(k * n3 + s)] * g *
                     std::conj(u1[static_cast<size_t>(i * n1 + p)]) *
                     std::conj(u2[static_cast<size_t>(j * n2 + q)]);
            }
        r[static_cast<size_t>((i * n2 + j) * n3 + k)] = acc;
      }
  double re = 0.0, im = 0.0;
  for (const auto& z : r) {
    re += z.real() * z.real();
    im += z.imag() * z.imag();
  }
  const bool use_real = re >= im;
  const double norm = std::sqrt(use_real ? re : im);
  at::Tensor out = at::empty({n1, n2, n3}, at::kDouble);
  double* o = out.data_ptr<double>();
  for (size_t t = 0; t < r.size(); ++t) o[t] = (use_real ? r[t].real() : r[t].imag()) / norm;
  return out;
}

}  // namespace crucible::mace
