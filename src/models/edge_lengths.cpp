// Edge lengths with a one-pass backward. See
// include/crucible/models/edge_lengths.h.

#include "crucible/models/edge_lengths.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <stdexcept>

namespace crucible {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

struct EdgeLengths : public Function<EdgeLengths> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& v_in) {
    const at::Tensor v = v_in.contiguous();
    const int64_t E = v.size(0);
    at::Tensor d = at::empty({E}, v.options());
    AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "edge_lengths", [&] {
      const scalar_t* p = v.data_ptr<scalar_t>();
      scalar_t* o = d.data_ptr<scalar_t>();
      at::parallel_for(0, E, 4096, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          const scalar_t x = p[3 * k], y = p[3 * k + 1], z = p[3 * k + 2];
          o[k] = std::sqrt(x * x + y * y + z * z);
        }
      });
    });
    ctx->save_for_backward({v, d});
    return d;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error("edge_lengths: no differentiable backward (create_graph); the training path uses "
                               "autograd's expression");
    }
    const auto s = ctx->get_saved_variables();
    const at::Tensor &v = s[0], &d = s[1];
    const at::Tensor g = grads[0].contiguous().to(v.scalar_type());
    const int64_t E = v.size(0);
    at::Tensor gv = at::empty_like(v);
    AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "edge_lengths_backward", [&] {
      const scalar_t *p = v.data_ptr<scalar_t>(), *dp = d.data_ptr<scalar_t>(), *gp = g.data_ptr<scalar_t>();
      scalar_t* o = gv.data_ptr<scalar_t>();
      at::parallel_for(0, E, 4096, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          const scalar_t w = dp[k] > 0 ? gp[k] / dp[k] : scalar_t(0);
          o[3 * k] = w * p[3 * k];
          o[3 * k + 1] = w * p[3 * k + 1];
          o[3 * k + 2] = w * p[3 * k + 2];
        }
      });
    });
    return {gv};
  }
};

}  // namespace

at::Tensor edge_lengths(const at::Tensor& v) {
  TORCH_CHECK(v.dim() == 2 && v.size(1) == 3, "edge_lengths: v must be [E,3], got ", v.sizes());
  const bool fast = v.device().is_cpu() && (v.scalar_type() == at::kFloat || v.scalar_type() == at::kDouble);
  if (!fast) return v.pow(2).sum(-1).sqrt();
  return EdgeLengths::apply(v);
}

}  // namespace crucible
