// The inference engine's spherical harmonics: one fused loop, forward and
// reverse. See include/crucible/models/mace/spherical_harmonics.h.

#include "crucible/models/mace/spherical_harmonics.h"
#include "harmonic_constants.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace crucible::mace {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

constexpr int64_t kRowsPerTask = 4096;

/// The unit vector of row v and 1/|v| (0 and 0 for a zero row; v itself
/// and 1 without normalisation).
template <class T>
inline bool unit(const T* v, bool normalize, T u[3], T& inv) {
  if (!normalize) {
    u[0] = v[0], u[1] = v[1], u[2] = v[2];
    inv = T(1);
    return true;
  }
  const T sq = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
  if (!(sq > T(0))) {
    u[0] = u[1] = u[2] = inv = T(0);
    return false;
  }
  inv = T(1) / std::sqrt(sq);
  u[0] = v[0] * inv, u[1] = v[1] * inv, u[2] = v[2] * inv;
  return true;
}

template <class T>
void forward_rows(const detail::HarmonicConstants& k, const T* v, T* Y, int64_t e0, int64_t e1, int lmax,
                  bool normalize) {
  const int64_t D = (lmax + 1) * (lmax + 1);
  for (int64_t e = e0; e < e1; ++e) {
    T u[3], inv;
    const bool has_direction = unit(v + 3 * e, normalize, u, inv);
    T* y = Y + D * e;
    y[0] = T(k.k00);
    if (lmax == 0) continue;
    if (!has_direction) {
      for (int64_t j = 1; j < D; ++j) y[j] = T(0);
      continue;
    }
    const T x = u[0], yy = u[1], z = u[2];
    y[1] = T(k.k1) * yy, y[2] = T(k.k1) * z, y[3] = T(k.k1) * x;
    if (lmax == 1) continue;
    y[4] = T(k.k2a) * x * yy;
    y[5] = T(k.k2a) * yy * z;
    y[6] = T(k.k2b) * (T(3) * z * z - T(1));
    y[7] = T(k.k2a) * x * z;
    y[8] = T(k.k2d) * (x * x - yy * yy);
    if (lmax == 2) continue;
    const T z2 = z * z;
    y[9] = T(k.k3c3) * yy * (T(3) * x * x - yy * yy);
    y[10] = T(k.k3c2) * x * yy * z;
    y[11] = T(k.k3c1) * yy * (T(5) * z2 - T(1));
    y[12] = T(k.k3c0) * z * (T(5) * z2 - T(3));
    y[13] = T(k.k3c1) * x * (T(5) * z2 - T(1));
    y[14] = T(k.k3c2b) * z * (x * x - yy * yy);
    y[15] = T(k.k3c3) * x * (x * x - T(3) * yy * yy);
  }
}

template <class T>
void backward_rows(const detail::HarmonicConstants& k, const T* v, const T* gY, T* gv, int64_t e0, int64_t e1,
                   int lmax, bool normalize) {
  const int64_t D = (lmax + 1) * (lmax + 1);
  for (int64_t e = e0; e < e1; ++e) {
    T u[3], inv;
    T* out = gv + 3 * e;
    if (lmax == 0 || !unit(v + 3 * e, normalize, u, inv)) {
      out[0] = out[1] = out[2] = T(0);
      continue;
    }
    const T x = u[0], y = u[1], z = u[2];
    const T* g = gY + D * e;
    // g_u = Σ_lm g_lm ∂Y_lm/∂(x, y, z), the polynomials differentiated term by term.
    T gx = T(k.k1) * g[3], gy = T(k.k1) * g[1], gz = T(k.k1) * g[2];
    if (lmax >= 2) {
      gx += T(k.k2a) * (y * g[4] + z * g[7]) + T(2 * k.k2d) * x * g[8];
      gy += T(k.k2a) * (x * g[4] + z * g[5]) - T(2 * k.k2d) * y * g[8];
      gz += T(k.k2a) * (y * g[5] + x * g[7]) + T(6 * k.k2b) * z * g[6];
    }
    if (lmax >= 3) {
      const T z2 = z * z, x2 = x * x, y2 = y * y;
      gx += T(k.k3c3) * (T(6) * x * y * g[9] + (T(3) * x2 - T(3) * y2) * g[15]) + T(k.k3c2) * y * z * g[10] +
            T(k.k3c1) * (T(5) * z2 - T(1)) * g[13] + T(2 * k.k3c2b) * x * z * g[14];
      gy += T(k.k3c3) * ((T(3) * x2 - T(3) * y2) * g[9] - T(6) * x * y * g[15]) + T(k.k3c2) * x * z * g[10] +
            T(k.k3c1) * (T(5) * z2 - T(1)) * g[11] - T(2 * k.k3c2b) * y * z * g[14];
      gz += T(k.k3c2) * x * y * g[10] + T(10 * k.k3c1) * z * (y * g[11] + x * g[13]) +
            T(k.k3c0) * (T(15) * z2 - T(3)) * g[12] + T(k.k3c2b) * (x2 - y2) * g[14];
    }
    if (!normalize) {
      out[0] = gx, out[1] = gy, out[2] = gz;
      continue;
    }
    const T radial = gx * x + gy * y + gz * z;  // the part along r̂, removed
    out[0] = (gx - radial * x) * inv;
    out[1] = (gy - radial * y) * inv;
    out[2] = (gz - radial * z) * inv;
  }
}

struct HarmonicsEngine : public Function<HarmonicsEngine> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& vectors, int64_t lmax, bool normalize) {
    const at::Tensor v = vectors.contiguous();
    ctx->save_for_backward({v});
    ctx->saved_data["lmax"] = lmax;
    ctx->saved_data["normalize"] = normalize;
    const int64_t E = v.size(0);
    at::Tensor Y = at::empty({E, (lmax + 1) * (lmax + 1)}, v.options());
    const detail::HarmonicConstants k = detail::harmonic_constants();
    AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "spherical_harmonics_engine", [&] {
      const scalar_t* vp = v.data_ptr<scalar_t>();
      scalar_t* yp = Y.data_ptr<scalar_t>();
      at::parallel_for(0, E, kRowsPerTask, [&](int64_t e0, int64_t e1) {
        forward_rows(k, vp, yp, e0, e1, static_cast<int>(lmax), normalize);
      });
    });
    return Y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error(
          "spherical_harmonics_engine: no differentiable backward (create_graph); use ComputeOptions::training");
    }
    const at::Tensor v = ctx->get_saved_variables()[0];
    const int64_t lmax = ctx->saved_data["lmax"].toInt();
    const bool normalize = ctx->saved_data["normalize"].toBool();
    const at::Tensor gY = grads[0].to(v.scalar_type()).contiguous();
    at::Tensor gv = at::empty_like(v);
    const detail::HarmonicConstants k = detail::harmonic_constants();
    AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "spherical_harmonics_engine_backward", [&] {
      const scalar_t* vp = v.data_ptr<scalar_t>();
      const scalar_t* gp = gY.data_ptr<scalar_t>();
      scalar_t* op = gv.data_ptr<scalar_t>();
      at::parallel_for(0, v.size(0), kRowsPerTask, [&](int64_t e0, int64_t e1) {
        backward_rows(k, vp, gp, op, e0, e1, static_cast<int>(lmax), normalize);
      });
    });
    return {gv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor spherical_harmonics_engine(const at::Tensor& vectors, int lmax, bool normalize) {
  detail::check_harmonics_arguments("spherical_harmonics_engine", vectors, lmax);
  const at::ScalarType dt = vectors.scalar_type();
  if (!vectors.device().is_cpu() || (dt != at::kFloat && dt != at::kDouble)) {
    return spherical_harmonics(vectors, lmax, normalize);
  }
  return HarmonicsEngine::apply(vectors, static_cast<int64_t>(lmax), normalize);
}

}  // namespace crucible::mace
