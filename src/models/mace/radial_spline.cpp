// Radial weights as quintic Hermite splines. See
// include/crucible/models/mace/radial_spline.h.

#include "crucible/models/mace/radial_spline.h"

#include "../../simd_clones.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace crucible::mace {
namespace {

/// Interval index and local coordinate t ∈ [0, 1] of r.
inline void locate(double r, double inv_h, int64_t G, int64_t* g, double* t) {
  double x = std::max(0.0, r * inv_h);
  int64_t i = static_cast<int64_t>(x);
  if (i >= G) i = G - 1;
  *g = i;
  *t = std::min(1.0, x - static_cast<double>(i));
}

// One pair's row: S = c0 + t (c1 + t (c2 + t (c3 + t (c4 + t c5)))) over K
// outputs; S'(t) = c1 + t (2c2 + t (3c3 + t (4c4 + t 5c5))); and Σ_k g_k S'_k
// summed in 16 fixed lanes (k mod 16) and then in lane order: the same bits
// in every ISA clone.
#define CRUCIBLE_SPLINE_ROWS(T, NAME)                                                                           \
  CRUCIBLE_SIMD_CLONES void horner_row_##NAME(const T* c0, T t, int64_t K, T* o) {                              \
    const T *c1 = c0 + K, *c2 = c1 + K, *c3 = c2 + K, *c4 = c3 + K, *c5 = c4 + K;                             \
    _Pragma("omp simd") for (int64_t k = 0; k < K; ++k)                                                         \
      o[k] = c0[k] + t * (c1[k] + t * (c2[k] + t * (c3[k] + t * (c4[k] + t * c5[k]))));                         \
  }                                                                                                             \
  CRUCIBLE_SIMD_CLONES T slope_dot_##NAME(const T* c0, T t, const T* g, int64_t K) {                            \
    const T *c1 = c0 + K, *c2 = c1 + K, *c3 = c2 + K, *c4 = c3 + K, *c5 = c4 + K;                             \
    T lane[16] = {};                                                                                            \
    int64_t k = 0;                                                                                              \
    for (; k + 16 <= K; k += 16) {                                                                              \
      _Pragma("omp simd") for (int64_t l = 0; l < 16; ++l) {                                                    \
        const int64_t q = k + l;                                                                                \
        lane[l] += g[q] * (c1[q] + t * (2 * c2[q] + t * (3 * c3[q] + t * (4 * c4[q] + t * (5 * c5[q])))));     \
      }                                                                                                         \
    }                                                                                                           \
    for (int64_t l = 0; k < K; ++k, ++l)                                                                        \
      lane[l] += g[k] * (c1[k] + t * (2 * c2[k] + t * (3 * c3[k] + t * (4 * c4[k] + t * (5 * c5[k])))));        \
    T acc = 0;                                                                                                  \
    for (int l = 0; l < 16; ++l) acc += lane[l];                                                                \
    return acc;                                                                                                 \
  }                                                                                                             \
  CRUCIBLE_SIMD_CLONES void slope_row_##NAME(const T* c0, T t, T inv_h, int64_t K, T* o) {                      \
    const T *c1 = c0 + K, *c2 = c1 + K, *c3 = c2 + K, *c4 = c3 + K, *c5 = c4 + K;                             \
    _Pragma("omp simd") for (int64_t k = 0; k < K; ++k)                                                         \
      o[k] = (c1[k] + t * (2 * c2[k] + t * (3 * c3[k] + t * (4 * c4[k] + t * (5 * c5[k]))))) * inv_h;           \
  }
CRUCIBLE_SPLINE_ROWS(float, f32)
CRUCIBLE_SPLINE_ROWS(double, f64)
#undef CRUCIBLE_SPLINE_ROWS

inline void horner_row(const float* c, float t, int64_t K, float* o) { horner_row_f32(c, t, K, o); }
inline void horner_row(const double* c, double t, int64_t K, double* o) { horner_row_f64(c, t, K, o); }
inline float slope_dot(const float* c, float t, const float* g, int64_t K) { return slope_dot_f32(c, t, g, K); }
inline double slope_dot(const double* c, double t, const double* g, int64_t K) { return slope_dot_f64(c, t, g, K); }
inline void slope_row(const float* c, float t, float inv_h, int64_t K, float* o) { slope_row_f32(c, t, inv_h, K, o); }
inline void slope_row(const double* c, double t, double inv_h, int64_t K, double* o) { slope_row_f64(c, t, inv_h, K, o); }

template <typename T>
void eval_values(const T* c, const double* r, T* out, int64_t P, int64_t K, int64_t G, double inv_h) {
  at::parallel_for(0, P, 64, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      int64_t g;
      double t;
      locate(r[p], inv_h, G, &g, &t);
      horner_row(c + g * 6 * K, static_cast<T>(t), K, out + p * K);
    }
  });
}

template <typename T>
void eval_backward(const T* c, const double* r, const T* g_in, T* out, int64_t P, int64_t K, int64_t G,
                   double inv_h) {
  at::parallel_for(0, P, 64, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      int64_t g;
      double t;
      locate(r[p], inv_h, G, &g, &t);
      out[p] = slope_dot(c + g * 6 * K, static_cast<T>(t), g_in + p * K, K) * static_cast<T>(inv_h);  // dS/dr = (dS/dt)/h
    }
  });
}

}  // namespace

RadialSpline::RadialSpline(const Function& f, double r_max, int64_t num_intervals, at::ScalarType dtype,
                           Origin origin)
    : r_max_(r_max), G_(num_intervals) {
  if (!(r_max > 0) || !std::isfinite(r_max)) throw std::invalid_argument("RadialSpline: r_max must be > 0");
  if (num_intervals < 1) throw std::invalid_argument("RadialSpline: num_intervals must be >= 1");
  if (dtype != at::kFloat && dtype != at::kDouble) {
    throw std::invalid_argument("RadialSpline: the table's dtype must be float32 or float64");
  }
  h_ = r_max / static_cast<double>(G_);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor nodes = at::arange(G_ + 1, f64) * h_;
  if (origin == Origin::kEven) nodes[0] = 1e-9 * h_;
  const RadialSpline::Values v = f(nodes);
  at::Tensor y = v.value, dy = v.first, d2y = v.second;
  if (y.dim() != 2 || y.size(0) != G_ + 1 || dy.sizes() != y.sizes() || d2y.sizes() != y.sizes()) {
    throw std::invalid_argument("RadialSpline: the function must return [M,K] values and derivatives for r [M]");
  }
  // R is even in r (sin(kr)/r, and envelopes in r^p with p >= 2), so
  // R'(0) = 0, and R''(0) is R''(1e-3 h) to O(1e-6 h² R⁗). Autograd's
  // derivatives of sin(kr)/r at r ≈ 0 cancel two O(1/r^n) terms: garbage at
  // 1e-9 h, which spread over the first interval.
  if (origin == Origin::kEven) {
    dy = dy.clone();
    dy[0].zero_();
    d2y = d2y.clone();
    d2y[0].copy_(f(at::full({1}, 1e-3 * h_, f64)).second[0]);
  }
  K_ = y.size(1);
  const at::Tensor d = y.slice(0, 1, G_ + 1) - y.slice(0, 0, G_);
  const at::Tensor m0 = dy.slice(0, 0, G_) * h_, m1 = dy.slice(0, 1, G_ + 1) * h_;
  const at::Tensor a0 = d2y.slice(0, 0, G_) * (h_ * h_), a1 = d2y.slice(0, 1, G_ + 1) * (h_ * h_);
  const at::Tensor c = at::stack({y.slice(0, 0, G_), m0, 0.5 * a0, 10 * d - 6 * m0 - 4 * m1 - 0.5 * (3 * a0 - a1),
                                  -15 * d + 8 * m0 + 7 * m1 + 0.5 * (3 * a0 - 2 * a1),
                                  6 * d - 3 * m0 - 3 * m1 - 0.5 * (a0 - a1)},
                                 1)
                           .contiguous();

  // Errors at t = 1/4, 1/2, 3/4 of every interval, with the float64 table,
  // in blocks of 2048 distances (a [3G, K] float64 tensor is 0.5 GB for
  // G = 8192 and K = 2560).
  coefficients_ = c;
  double ymax = y.abs().max().item<double>(), dmax = dy.abs().max().item<double>(), ey = 0.0, ed = 0.0;
  const at::Tensor base = at::arange(G_, f64) * h_;
  const at::Tensor r_test = at::cat({base + 0.25 * h_, base + 0.5 * h_, base + 0.75 * h_});
  for (int64_t b = 0; b < r_test.size(0); b += 2048) {
    const at::Tensor r = r_test.slice(0, b, std::min(r_test.size(0), b + 2048));
    const RadialSpline::Values fv = f(r);
    const at::Tensor &fy = fv.value, &fdy = fv.first;
    ey = std::max(ey, (values(r) - fy).abs().max().item<double>());
    ed = std::max(ed, (derivatives(r) - fdy).abs().max().item<double>());
    ymax = std::max(ymax, fy.abs().max().item<double>());
    dmax = std::max(dmax, fdy.abs().max().item<double>());
  }
  value_error_ = ymax > 0 ? ey / ymax : 0.0;
  derivative_error_ = dmax > 0 ? ed / dmax : 0.0;
  coefficients_ = c.to(dtype).contiguous();
}

at::Tensor RadialSpline::values(const at::Tensor& r) const {
  const at::Tensor rd = r.detach().to(at::kCPU, at::kDouble).contiguous();
  const int64_t P = rd.size(0);
  at::Tensor out = at::empty({P, K_}, coefficients_.options());
  AT_DISPATCH_FLOATING_TYPES(coefficients_.scalar_type(), "radial_spline_values", [&] {
    eval_values<scalar_t>(coefficients_.data_ptr<scalar_t>(), rd.data_ptr<double>(), out.data_ptr<scalar_t>(), P, K_,
                          G_, 1.0 / h_);
  });
  return out;
}

at::Tensor RadialSpline::derivatives(const at::Tensor& r) const {
  const at::Tensor rd = r.detach().to(at::kCPU, at::kDouble).contiguous();
  const int64_t P = rd.size(0);
  at::Tensor out = at::empty({P, K_}, coefficients_.options());
  AT_DISPATCH_FLOATING_TYPES(coefficients_.scalar_type(), "radial_spline_derivatives", [&] {
    const scalar_t* c = coefficients_.data_ptr<scalar_t>();
    const double* rp = rd.data_ptr<double>();
    scalar_t* o = out.data_ptr<scalar_t>();
    const double inv_h = 1.0 / h_;
    at::parallel_for(0, P, 64, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        int64_t g;
        double t;
        locate(rp[p], inv_h, G_, &g, &t);
        slope_row(c + g * 6 * K_, static_cast<scalar_t>(t), static_cast<scalar_t>(inv_h), K_, o + p * K_);
      }
    });
  });
  return out;
}

at::Tensor RadialSpline::backward(const at::Tensor& r, const at::Tensor& g) const {
  const at::Tensor rd = r.detach().to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor gc = g.to(coefficients_.scalar_type()).contiguous();
  const int64_t P = rd.size(0);
  TORCH_CHECK(gc.dim() == 2 && gc.size(0) == P && gc.size(1) == K_, "RadialSpline::backward: g must be [P,K]");
  at::Tensor out = at::empty({P}, coefficients_.options());
  AT_DISPATCH_FLOATING_TYPES(coefficients_.scalar_type(), "radial_spline_backward", [&] {
    eval_backward<scalar_t>(coefficients_.data_ptr<scalar_t>(), rd.data_ptr<double>(), gc.data_ptr<scalar_t>(),
                            out.data_ptr<scalar_t>(), P, K_, G_, 1.0 / h_);
  });
  return out;
}

RadialSpline tabulate_radial(const RadialSpline::Function& f, double r_max, double value_tolerance,
                             at::ScalarType dtype, RadialSpline::Origin origin) {
  for (int k = 5;; ++k) {
    RadialSpline s(f, r_max, int64_t{1} << k, dtype, origin);
    if (k == 12 || (s.value_error() <= value_tolerance && s.derivative_error() <= 100 * value_tolerance)) return s;
  }
}

}  // namespace crucible::mace
