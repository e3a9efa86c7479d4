// SiLU with hand-written derivatives and one-pass CPU loops (issue 19). See
// include/crucible/models/silu.h. Built with -fno-math-errno
// -fno-trapping-math (activation_loops.h, CMakeLists.txt).

#include "crucible/models/silu.h"
#include "activation_loops.h"

#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace crucible {
namespace {

using activation_loops::exp_of;
using activation_loops::in_float_blocks;
using activation_loops::loop_ok;
using activation_loops::loop_ok_with;
using activation_loops::map_elements;
using activation_loops::sigmoid_of;
using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// σ(x) and 1 − σ(x), without cancellation in 1 − σ for large x.
template <class A>
inline void sigmoid_pair(A v, A& s, A& one_minus_s) {
  const A e = exp_of(v < A(0) ? v : -v);
  s = sigmoid_of(v, e);
  one_minus_s = sigmoid_of(-v, e);
}

// silu'(v) = σ(1 + v(1 − σ)) from s = σ(v) and r = 1 − σ(v).
template <class A>
inline A derivative_of(A v, A s, A r) {
  return s * (A(1) + v * r);
}

// out[0] = silu(x), out[1] = silu'(x) (if NO == 2).
template <int NO>
struct ValueLoop {
  template <class In, class Out>
  CRUCIBLE_INLINE_IN_CLONES void operator()(const In& in, const Out& out, int64_t n) const {
    using A = activation_loops::element_of<In>;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      const A v = in[0][k];
      A s, r;
      sigmoid_pair(v, s, r);
      out[0][k] = v * s;
      if constexpr (NO == 2) out[1][k] = derivative_of(v, s, r);
    }
  }
};

// out[0] = g silu'(x); inputs g, x.
struct FirstLoop {
  template <class In, class Out>
  CRUCIBLE_INLINE_IN_CLONES void operator()(const In& in, const Out& out, int64_t n) const {
    using A = activation_loops::element_of<In>;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      const A v = in[1][k];
      A s, r;
      sigmoid_pair(v, s, r);
      out[0][k] = in[0][k] * derivative_of(v, s, r);
    }
  }
};

// d_g = gg silu'(x), d_x = gg g silu''(x); inputs gg, g, x.
struct SecondLoop {
  template <class In, class Out>
  CRUCIBLE_INLINE_IN_CLONES void operator()(const In& in, const Out& out, int64_t n) const {
    using A = activation_loops::element_of<In>;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      const A v = in[2][k];
      A s, r;
      sigmoid_pair(v, s, r);
      const A gg = in[0][k];
      out[0][k] = gg * derivative_of(v, s, r);
      out[1][k] = gg * in[1][k] * (s * r * (A(2) + v * (r - s)));
    }
  }
};

#define CRUCIBLE_SILU_INSTANCES(T, NAME)                                                                        \
  CRUCIBLE_SIMD_CLONES void silu_value_##NAME(const T* x, T* y, int64_t n) {                                    \
    in_float_blocks<T, 1, 1>({x}, {y}, n, ValueLoop<1>());                                                      \
  }                                                                                                             \
  CRUCIBLE_SIMD_CLONES void silu_both_##NAME(const T* x, T* y, T* d, int64_t n) {                               \
    in_float_blocks<T, 1, 2>({x}, {y, d}, n, ValueLoop<2>());                                                   \
  }                                                                                                             \
  CRUCIBLE_SIMD_CLONES void silu_first_##NAME(const T* g, const T* x, T* out, int64_t n) {                      \
    in_float_blocks<T, 2, 1>({g, x}, {out}, n, FirstLoop());                                                    \
  }                                                                                                             \
  CRUCIBLE_SIMD_CLONES void silu_second_##NAME(const T* gg, const T* g, const T* x, T* d_g, T* d_x,             \
                                                     int64_t n) {                                               \
    in_float_blocks<T, 3, 2>({gg, g, x}, {d_g, d_x}, n, SecondLoop());                                          \
  }                                                                                                             \
  inline void silu_value_any(const T* x, T* y, int64_t n) { silu_value_##NAME(x, y, n); }                       \
  inline void silu_both_any(const T* x, T* y, T* d, int64_t n) { silu_both_##NAME(x, y, d, n); }                \
  inline void silu_first_any(const T* g, const T* x, T* out, int64_t n) { silu_first_##NAME(g, x, out, n); }    \
  inline void silu_second_any(const T* gg, const T* g, const T* x, T* d_g, T* d_x, int64_t n) {                 \
    silu_second_##NAME(gg, g, x, d_g, d_x, n);                                                                  \
  }
CRUCIBLE_SILU_INSTANCES(float, f)
CRUCIBLE_SILU_INSTANCES(double, d)
CRUCIBLE_SILU_INSTANCES(c10::BFloat16, bf)
#undef CRUCIBLE_SILU_INSTANCES

// silu'(x) = σ(1 + x(1 − σ)) by ATen ops, for the cases the loops do not
// cover (differentiable further by autograd).
at::Tensor derivative_reference(const at::Tensor& x) {
  const at::Tensor s = at::sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}

/// out = g · silu'(x). Inputs g and x (x for the second-order term).
struct SiluGrad : public Function<SiluGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g, const at::Tensor& x) {
    ctx->save_for_backward({g, x});
    if (!loop_ok_with(x, g)) return g * derivative_reference(x);
    return map_elements<1, 2>({g, x}, [](const auto& in, const auto& out, int64_t n) {
      silu_first_any(in[0], in[1], out[0], n);
    })[0];
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &x = saved[1], &gg = grads[0];
    if (!gg.defined()) return {at::Tensor(), at::Tensor()};
    // With create_graph (a third derivative) ATen ops, which autograd
    // differentiates further; the training path never asks for it.
    if (at::GradMode::is_enabled() || !loop_ok_with(x, g) || !loop_ok_with(x, gg)) {
      const at::Tensor s = at::sigmoid(x);
      return {gg * derivative_reference(x), gg * g * s * (1.0 - s) * (2.0 + x * (1.0 - 2.0 * s))};
    }
    const auto d = map_elements<2, 3>({gg, g, x}, [](const auto& in, const auto& out, int64_t n) {
      silu_second_any(in[0], in[1], in[2], out[0], out[1], n);
    });
    return {d[0], d[1]};
  }
};

/// silu(x), whose backward is SiluGrad (so a second backward is hand-written too).
struct Silu : public Function<Silu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return map_elements<1, 1>({x}, [](const auto& in, const auto& out, int64_t n) {
      silu_value_any(in[0], out[0], n);
    })[0];
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {SiluGrad::apply(grads[0], ctx->get_saved_variables()[0])};
  }
};

}  // namespace

at::Tensor silu_fused(const at::Tensor& x) {
  if (!loop_ok(x)) return at::silu(x);
  return Silu::apply(x);
}

std::pair<at::Tensor, at::Tensor> silu_and_derivative(const at::Tensor& x) {
  if (!loop_ok(x)) return {at::silu(x), derivative_reference(x)};
  const auto yd = map_elements<2, 1>({x}, [](const auto& in, const auto& out, int64_t n) {
    silu_both_any(in[0], out[0], out[1], n);
  });
  return {yd[0], yd[1]};
}

}  // namespace crucible
