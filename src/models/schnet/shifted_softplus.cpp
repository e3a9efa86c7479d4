// Shifted softplus with hand-written derivatives (issue 7).

#include "crucible/models/shifted_softplus.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

namespace crucible {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

const double kLn2 = std::log(2.0);

/// out = g · σ(x): the first derivative applied to an incoming gradient.
/// Its backward gives the second-order terms: ∂/∂g = gg · σ, ∂/∂x = gg · g · σ(1 − σ).
struct SspGrad : public Function<SspGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g, const at::Tensor& x) {
    at::Tensor s = at::sigmoid(x);
    ctx->save_for_backward({g, s});
    return g * s;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = saved[0];
    const at::Tensor& s = saved[1];
    const at::Tensor gg_s = grads[0] * s;
    return {gg_s, gg_s * g * (1.0 - s)};
  }
};

/// ssp(x), whose backward is SspGrad (so a second backward is hand-written too).
struct Ssp : public Function<Ssp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return at::softplus(x) - kLn2;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {SspGrad::apply(grads[0], x)};
  }
};

}  // namespace

at::Tensor shifted_softplus(const at::Tensor& x) { return Ssp::apply(x); }

at::Tensor shifted_softplus_reference(const at::Tensor& x) { return at::softplus(x) - kLn2; }

}  // namespace crucible
