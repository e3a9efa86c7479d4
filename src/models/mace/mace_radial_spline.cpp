// MaceImpl::radial_spline: the inference path's radial weights as splines
// of the distance (issue 48). See include/crucible/models/mace/mace.h and
// include/crucible/models/mace/radial_spline.h.

#include "crucible/models/mace/mace.h"
#include "crucible/models/mace/radial.h"
#include "crucible/models/spline_cache.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>
#include <string>

namespace crucible {

bool MaceImpl::radial_spline_enabled() const {
  return radial_spline_ ? *radial_spline_ : radial_splines_from_environment();
}

std::shared_ptr<const mace::RadialSpline> MaceImpl::radial_spline(int64_t t) const {
  if (t < 0 || t >= options_.num_interactions) {
    throw std::out_of_range("MACE::radial_spline: layer " + std::to_string(t) + " outside 0.." +
                            std::to_string(options_.num_interactions - 1));
  }
  if (!radial_spline_enabled()) return nullptr;
  const auto& W = radial_[static_cast<size_t>(t)];
  const at::ScalarType layer = embedding_.scalar_type();
  auto build = [&] {
    // R(r), dR/dr and d²R/dr² in float64: the features b(r) f(r) and their
    // derivatives by autograd (two passes per basis function; each row
    // depends on its own r), then the MLP forward-mode by hand:
    //   z = h W, z' = h' W, z'' = h'' W,
    //   h ← silu(z), h' ← silu'(z) z', h'' ← silu''(z) z'² + silu'(z) z'',
    //   silu' = σ(1 + z(1 − σ)), silu'' = σ(1 − σ)(2 + z(1 − 2σ)).
    std::vector<at::Tensor> Wd;
    for (const at::Tensor& w : radial_mlp_weights(t)) Wd.push_back(w.detach().to(at::kCPU, at::kDouble));
    const bool mace_file = mace_basis();
    const at::Tensor freq = mace_file ? bessel_weights_.detach().to(at::kCPU, at::kDouble) : at::Tensor();
    const at::Tensor pref = mace_file ? bessel_prefactor_.detach().to(at::kCPU, at::kDouble) : at::Tensor();
    const at::Tensor rmax = mace_file ? cutoff_r_max_.detach().to(at::kCPU, at::kDouble) : at::Tensor();
    const MaceOptions o = options_;
    auto f = [Wd, freq, pref, rmax, o](const at::Tensor& r_in) {
      at::Tensor h, dh, d2h;
      {
        at::AutoGradMode grad(true);
        const at::Tensor r = r_in.detach().clone().requires_grad_(true);
        const at::Tensor feats =
            mace::radial_embedding(r, o.cutoff, o.num_bessel, o.num_polynomial_cutoff, freq, pref, rmax);
        std::vector<at::Tensor> first, second;
        for (int64_t j = 0; j < feats.size(1); ++j) {
          const at::Tensor g1 = torch::autograd::grad({feats.select(1, j).sum()}, {r}, {}, /*retain_graph=*/true,
                                                      /*create_graph=*/true)[0];
          const auto g2 = torch::autograd::grad({g1.sum()}, {r}, {}, /*retain_graph=*/true, /*create_graph=*/false,
                                                /*allow_unused=*/true)[0];
          first.push_back(g1.detach());
          second.push_back(g2.defined() ? g2 : at::zeros_like(g1).detach());
        }
        h = feats.detach();
        dh = at::stack(first, 1);
        d2h = at::stack(second, 1);
      }
      at::NoGradGuard no_grad;
      for (size_t k = 0; k < Wd.size(); ++k) {
        const at::Tensor z = at::mm(h, Wd[k]), dz = at::mm(dh, Wd[k]), d2z = at::mm(d2h, Wd[k]);
        if (k + 1 < Wd.size()) {
          const at::Tensor sig = at::sigmoid(z);
          const at::Tensor s1 = sig * (1.0 + z * (1.0 - sig));
          const at::Tensor s2 = sig * (1.0 - sig) * (2.0 + z * (1.0 - 2.0 * sig));
          h = z * sig;
          dh = s1 * dz;
          d2h = s2 * dz * dz + s1 * d2z;
        } else {
          h = z;
          dh = dz;
          d2h = d2z;
        }
      }
      return mace::RadialSpline::Values{h, dh, d2h};
    };
    return mace::tabulate_radial(f, o.cutoff, 1e-9, layer);
  };
  return spline_cache_->get(static_cast<size_t>(t), static_cast<size_t>(options_.num_interactions),
                            spline_signature(W, layer), build);
}

}  // namespace crucible
