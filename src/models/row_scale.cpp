// scale_rows / row_dot: fused CPU loops and mutually recursive derivatives.
// See include/crucible/models/row_scale.h.

#include "crucible/models/row_scale.h"
#include "bf16_bits.h"
#include "../simd_clones.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>

namespace crucible {
namespace {

using bf16_bits::narrow;
using bf16_bits::widen;
using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// Lanes of row_dot's partial sums: the order of the additions is fixed by
// the code, not by the vectoriser or the data's alignment.
constexpr int64_t kLanes = 16;

template <class T>
CRUCIBLE_INLINE_IN_CLONES void scale_rows_kernel(const T* __restrict a, const T* __restrict s, T* __restrict out,
                                                 int64_t r0, int64_t r1, int64_t K) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto f = widen(s[r]);
    const T* __restrict ar = a + r * K;
    T* __restrict o = out + r * K;
    for (int64_t k = 0; k < K; ++k) o[k] = narrow<T>(widen(ar[k]) * f);
  }
}

template <class T>
CRUCIBLE_INLINE_IN_CLONES void row_dot_kernel(const T* __restrict a, const T* __restrict b, T* __restrict out,
                                              int64_t r0, int64_t r1, int64_t K) {
  using A = decltype(widen(T()));
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict ar = a + r * K;
    const T* __restrict br = b + r * K;
    A lane[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += widen(ar[k + l]) * widen(br[k + l]);
    }
    for (int64_t l = 0; k < K; ++k, ++l) lane[l] += widen(ar[k]) * widen(br[k]);
    A sum = 0;
    for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
    out[r] = narrow<T>(sum);
  }
}

#define CRUCIBLE_ROW_INSTANCES(T, NAME)                                                                    \
  CRUCIBLE_SIMD_CLONES void scale_rows_##NAME(const T* a, const T* s, T* out, int64_t r0, int64_t r1,     \
                                             int64_t K) {                                                 \
    scale_rows_kernel<T>(a, s, out, r0, r1, K);                                                           \
  }                                                                                                       \
  CRUCIBLE_SIMD_CLONES void row_dot_##NAME(const T* a, const T* b, T* out, int64_t r0, int64_t r1,        \
                                          int64_t K) {                                                    \
    row_dot_kernel<T>(a, b, out, r0, r1, K);                                                              \
  }                                                                                                       \
  inline void scale_rows_any(const T* a, const T* s, T* out, int64_t r0, int64_t r1, int64_t K) {         \
    scale_rows_##NAME(a, s, out, r0, r1, K);                                                              \
  }                                                                                                       \
  inline void row_dot_any(const T* a, const T* b, T* out, int64_t r0, int64_t r1, int64_t K) {            \
    row_dot_##NAME(a, b, out, r0, r1, K);                                                                 \
  }
CRUCIBLE_ROW_INSTANCES(float, f)
CRUCIBLE_ROW_INSTANCES(double, d)
CRUCIBLE_ROW_INSTANCES(c10::BFloat16, bf)
#undef CRUCIBLE_ROW_INSTANCES

bool fused_ok(const at::Tensor& a) {
  const auto t = a.scalar_type();
  return a.device().is_cpu() && (t == at::kFloat || t == at::kDouble || t == at::kBFloat16);
}

// Rows per task: ~32k elements, so small tensors run on the calling thread.
int64_t row_grain(int64_t K) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1)); }

at::Tensor scale_rows_forward(const at::Tensor& a, const at::Tensor& s) {
  if (!fused_ok(a)) return a * s.unsqueeze(-1);
  const at::Tensor ac = a.contiguous(), sc = s.contiguous();
  at::Tensor out = at::empty(ac.sizes(), ac.options());
  const int64_t K = ac.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, ac.scalar_type(), "scale_rows", [&] {
    const scalar_t* ap = ac.data_ptr<scalar_t>();
    const scalar_t* sp = sc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, ac.size(0), row_grain(K),
                     [&](int64_t r0, int64_t r1) { scale_rows_any(ap, sp, op, r0, r1, K); });
  });
  return out;
}

at::Tensor row_dot_forward(const at::Tensor& a, const at::Tensor& b) {
  if (!fused_ok(a)) return (a * b).sum(-1);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = at::empty({ac.size(0)}, ac.options());
  const int64_t K = ac.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, ac.scalar_type(), "row_dot", [&] {
    const scalar_t* ap = ac.data_ptr<scalar_t>();
    const scalar_t* bp = bc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, ac.size(0), row_grain(K),
                     [&](int64_t r0, int64_t r1) { row_dot_any(ap, bp, op, r0, r1, K); });
  });
  return out;
}

struct RowDot;

struct ScaleRows : public Function<ScaleRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& s) {
    ctx->save_for_backward({a, s});
    return scale_rows_forward(a, s);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

struct RowDot : public Function<RowDot> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return row_dot_forward(a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = ScaleRows::apply(saved[1], g);
    if (ctx->needs_input_grad(1)) gb = ScaleRows::apply(saved[0], g);
    return {ga, gb};
  }
};

variable_list ScaleRows::backward(AutogradContext* ctx, variable_list grads) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& g = grads[0];
  at::Tensor ga, gs;
  if (ctx->needs_input_grad(0)) ga = ScaleRows::apply(g, saved[1]);
  if (ctx->needs_input_grad(1)) gs = RowDot::apply(g, saved[0]);
  return {ga, gs};
}

}  // namespace

at::Tensor scale_rows(const at::Tensor& a, const at::Tensor& s) {
  TORCH_CHECK(a.dim() == 2 && s.dim() == 1 && s.size(0) == a.size(0),
              "scale_rows: a [R,K] and s [R] expected, got a ", a.sizes(), " and s ", s.sizes());
  TORCH_CHECK(a.device() == s.device(), "scale_rows: a and s must share one device, got ", a.device(), " and ",
              s.device());
  return ScaleRows::apply(a, s.to(a.scalar_type()));
}

at::Tensor row_dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && a.sizes() == b.sizes(), "row_dot: a and b [R,K] of one shape expected, got a ",
              a.sizes(), " and b ", b.sizes());
  TORCH_CHECK(a.device() == b.device(), "row_dot: a and b must share one device, got ", a.device(), " and ",
              b.device());
  return RowDot::apply(a, b.to(a.scalar_type()));
}

}  // namespace crucible
