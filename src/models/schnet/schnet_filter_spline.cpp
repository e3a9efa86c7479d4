// SchNetImpl::filter_spline: the inference path's filter network as splines
// of the distance (issue 48). See include/crucible/models/schnet.h and
// include/crucible/models/mace/radial_spline.h.

#include "crucible/models/schnet.h"
#include "crucible/models/shifted_softplus.h"
#include "crucible/models/spline_cache.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace crucible {
namespace {

constexpr double kPi = 3.14159265358979323846;

/// W(r), W'(r) and W''(r) [M,K] float64 for r [M] float64 (Å) in [0, r_c]:
/// SchNet's filter W = y · f_c with y = ssp(z) W2ᵀ + b2, z = g W1ᵀ + b1,
/// forward-mode by hand (schnet.h, filter_spline):
///   g_k = exp(-γ δ_k²), δ_k = r - μ_k:  g' = -2γ δ g,  g'' = (4γ² δ² - 2γ) g;
///   z' = g' W1ᵀ, z'' = g'' W1ᵀ;  ssp' = σ, ssp'' = σ(1 - σ)
///   (ssp and σ from shifted_softplus_and_sigmoid, exact for every z):
///   a = ssp(z), a' = σ z', a'' = σ(1 - σ) z'² + σ z'';
///   y' = a' W2ᵀ, y'' = a'' W2ᵀ;
///   f_c = ½(cos(πr/r_c) + 1), f_c' = -½(π/r_c) sin(πr/r_c), f_c'' = -½(π/r_c)² cos(πr/r_c);
///   W' = y' f_c + y f_c',  W'' = y'' f_c + 2 y' f_c' + y f_c''.
struct FilterFunction {
  at::Tensor w1, b1, w2, b2, mu;  // float64, CPU
  double gamma = 0, rc = 0;

  mace::RadialSpline::Values operator()(const at::Tensor& r_in) const {
    at::NoGradGuard no_grad;
    const at::Tensor r = r_in.to(at::kDouble).unsqueeze(1);  // [M,1]
    const at::Tensor dm = r - mu;                            // [M,G]
    const at::Tensor g = at::exp(-gamma * dm * dm);
    const at::Tensor g1 = -2.0 * gamma * dm * g;
    const at::Tensor g2 = (4.0 * gamma * gamma * dm * dm - 2.0 * gamma) * g;
    const at::Tensor z = at::addmm(b1, g, w1.t()), z1 = at::mm(g1, w1.t()), z2 = at::mm(g2, w1.t());
    // ssp without at::softplus's switch to the identity above z = 20 (a
    // 2e-9 step that the spline would smear over its interval).
    const auto [a, sig] = shifted_softplus_and_sigmoid(z);
    const at::Tensor a1 = sig * z1;
    const at::Tensor a2 = sig * (1.0 - sig) * z1 * z1 + sig * z2;
    const at::Tensor y = at::addmm(b2, a, w2.t()), y1 = at::mm(a1, w2.t()), y2 = at::mm(a2, w2.t());
    // f_c on the closed interval [0, r_c]: the node r = r_c takes the left
    // limits (f_c'' jumps there from ½(π/r_c)² to 0; a zero second
    // derivative at that node cost the last interval 1e-5 relative in W').
    const double k = kPi / rc;
    const at::Tensor c = 0.5 * (at::cos(k * r) + 1.0);
    const at::Tensor c1 = -0.5 * k * at::sin(k * r);
    const at::Tensor c2 = -0.5 * k * k * at::cos(k * r);
    return {y * c, y1 * c + y * c1, y2 * c + 2.0 * y1 * c1 + y * c2};
  }
};

}  // namespace

bool SchNetImpl::filter_spline_enabled() const {
  return filter_spline_ ? *filter_spline_ : radial_splines_from_environment();
}

std::shared_ptr<const mace::RadialSpline> SchNetImpl::filter_spline(int64_t t) const {
  if (t < 0 || t >= options_.num_interactions) {
    throw std::out_of_range("SchNet::filter_spline: interaction " + std::to_string(t) + " outside 0.." +
                            std::to_string(options_.num_interactions - 1));
  }
  if (!filter_spline_enabled()) return nullptr;
  const auto* f1 = filter1_->ptr<torch::nn::LinearImpl>(t).get();
  const auto* f2 = filter2_->ptr<torch::nn::LinearImpl>(t).get();
  const at::ScalarType layer = out2_->weight.scalar_type();
  auto build = [&] {
    auto f64 = [](const at::Tensor& x) { return x.detach().to(at::kCPU, at::kDouble).contiguous(); };
    const double delta = options_.cutoff / static_cast<double>(options_.num_gaussians - 1);
    const FilterFunction f{f64(f1->weight), f64(f1->bias), f64(f2->weight), f64(f2->bias), f64(offsets_),
                           0.5 / (delta * delta), options_.cutoff};
    return mace::tabulate_radial(f, options_.cutoff, 1e-9, layer, mace::RadialSpline::Origin::kSmooth);
  };
  return spline_cache_->get(static_cast<size_t>(t), static_cast<size_t>(options_.num_interactions),
                            spline_signature({f1->weight, f1->bias, f2->weight, f2->bias, offsets_}, layer), build);
}

}  // namespace crucible
