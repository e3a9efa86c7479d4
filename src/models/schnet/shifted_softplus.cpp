// Shifted softplus with hand-written derivatives (issue 7) and one-pass CPU
// loops (issue 19).
//
// The loops' shared pieces (libmvec, ranges, bfloat16 blocks) are in
// activation_loops.h; this file is built with -fno-math-errno
// -fno-trapping-math (CMakeLists.txt).

#include "crucible/models/shifted_softplus.h"
#include "../activation_loops.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

namespace crucible {
namespace {

using activation_loops::exp_of;
using activation_loops::log_of;
using activation_loops::loop_ok;
using activation_loops::map_elements;
using bf16_bits::narrow;
using bf16_bits::widen;
using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

const double kLn2 = std::log(2.0);

// y = ssp(x) = max(x, 0) + ln(1 + e^-|x|) − ln 2 and s = σ(x) from the one
// exponential e = e^-|x| ∈ (0, 1]: σ(x) = 1/(1+e) for x ≥ 0, e/(1+e) below.
// ln(1 + e) instead of log1p(e): 1 + e rounds off at most one ulp of 1, an
// absolute error far below the value's own rounding. Inputs x; outputs y, s.
struct SspSigmoidLoop {
  template <class In, class Out>
  CRUCIBLE_INLINE_IN_CLONES void operator()(const In& in, const Out& out, int64_t n) const {
    using A = activation_loops::element_of<In>;
    const A ln2 = static_cast<A>(kLn2);
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      const A v = in[0][k];
      const A e = exp_of(v < A(0) ? v : -v);
      out[0][k] = (v > A(0) ? v : A(0)) + log_of(A(1) + e) - ln2;
      out[1][k] = activation_loops::sigmoid_of(v, e);
    }
  }
};

// The second-order terms of SspGrad (out = g σ): d_g = gg σ, d_x = gg g σ(1 − σ).
template <class T, class A>
inline void ssp_second_loop(const T* gg, const T* g, const T* s, T* d_g, T* d_x, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const A sv = widen(s[k]);
    const A ggs = widen(gg[k]) * sv;
    d_g[k] = narrow<T, A>(ggs);
    d_x[k] = narrow<T, A>(ggs * widen(g[k]) * (A(1) - sv));
  }
}

#define CRUCIBLE_SSP_INSTANCES(T, A, NAME)                                                                     \
  CRUCIBLE_SIMD_CLONES void ssp_sigmoid_##NAME(const T* x, T* y, T* s, int64_t n) {                            \
    activation_loops::in_float_blocks<T, 1, 2>({x}, {y, s}, n, SspSigmoidLoop());                              \
  }                                                                                                            \
  CRUCIBLE_SIMD_CLONES void ssp_second_##NAME(const T* gg, const T* g, const T* s, T* d_g, T* d_x,             \
                                                    int64_t n) {                                               \
    ssp_second_loop<T, A>(gg, g, s, d_g, d_x, n);                                                              \
  }                                                                                                            \
  inline void ssp_sigmoid_any(const T* x, T* y, T* s, int64_t n) { ssp_sigmoid_##NAME(x, y, s, n); }           \
  inline void ssp_second_any(const T* gg, const T* g, const T* s, T* d_g, T* d_x, int64_t n) {                 \
    ssp_second_##NAME(gg, g, s, d_g, d_x, n);                                                                  \
  }
CRUCIBLE_SSP_INSTANCES(float, float, f)
CRUCIBLE_SSP_INSTANCES(double, double, d)
CRUCIBLE_SSP_INSTANCES(c10::BFloat16, float, bf)
#undef CRUCIBLE_SSP_INSTANCES

/// d_g = gg σ, d_x = gg g σ(1 − σ): one pass on the CPU, else ATen ops.
std::pair<at::Tensor, at::Tensor> ssp_second_order(const at::Tensor& gg, const at::Tensor& g, const at::Tensor& s) {
  if (!activation_loops::loop_ok_with(s, gg) || !activation_loops::loop_ok_with(s, g)) {
    const at::Tensor ggs = gg * s;
    return {ggs, ggs * g * (1.0 - s)};
  }
  const auto d = map_elements<2, 3>({gg, g, s}, [](const auto& in, const auto& out, int64_t n) {
    ssp_second_any(in[0], in[1], in[2], out[0], out[1], n);
  });
  return {d[0], d[1]};
}

/// out = g · σ(x): the first derivative applied to an incoming gradient.
/// σ comes precomputed from Ssp's forward (input 2, no gradient); x is an
/// input so that the second-order term reaches it.
struct SspGrad : public Function<SspGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g, const at::Tensor& /*x*/,
                            const at::Tensor& s) {
    ctx->save_for_backward({g, s});
    return g * s;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto [d_g, d_x] = ssp_second_order(grads[0], saved[0], saved[1]);
    return {d_g, d_x, at::Tensor()};
  }
};

/// ssp(x), whose backward is SspGrad (so a second backward is hand-written too).
struct Ssp : public Function<Ssp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    auto [y, s] = shifted_softplus_and_sigmoid(x);
    ctx->save_for_backward({x, s});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {SspGrad::apply(grads[0], saved[0], saved[1])};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> shifted_softplus_and_sigmoid(const at::Tensor& x) {
  if (!loop_ok(x)) return {at::softplus(x) - kLn2, at::sigmoid(x)};
  const auto ys = map_elements<2, 1>({x}, [](const auto& in, const auto& out, int64_t n) {
    ssp_sigmoid_any(in[0], out[0], out[1], n);
  });
  return {ys[0], ys[1]};
}

at::Tensor shifted_softplus(const at::Tensor& x) { return Ssp::apply(x); }

at::Tensor shifted_softplus_reference(const at::Tensor& x) { return at::softplus(x) - kLn2; }

}  // namespace crucible
