// sparse_row_combination: see include/crucible/models/sparse_rows.h.

#include "crucible/models/sparse_rows.h"
#include "../simd_clones.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace crucible {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

/// The nonzero entries of a [R, M] (float64 on the CPU), row by row: CSR.
struct SparseRows {
  std::vector<int64_t> first;  ///< [R + 1] offsets into column/value.
  std::vector<int64_t> column;
  std::vector<double> value;
};

SparseRows sparse_rows(const at::Tensor& a) {
  const at::Tensor ad = a.to(at::kCPU, at::kDouble).contiguous();
  const int64_t R = ad.size(0), M = ad.size(1);
  const double* p = ad.data_ptr<double>();
  SparseRows s;
  s.first.reserve(static_cast<size_t>(R) + 1);
  s.first.push_back(0);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t m = 0; m < M; ++m) {
      if (p[r * M + m] != 0.0) {
        s.column.push_back(m);
        s.value.push_back(p[r * M + m]);
      }
    }
    s.first.push_back(static_cast<int64_t>(s.column.size()));
  }
  return s;
}

// Output rows [r0, r1), columns [k0, k1): out[r, k] = Σ a[r, m] · x[m, k].
template <class T>
CRUCIBLE_INLINE_IN_CLONES void combine_kernel(const int64_t* first, const int64_t* column, const T* value,
                                              const T* __restrict x, T* __restrict out, int64_t r0, int64_t r1,
                                              int64_t k0, int64_t k1, int64_t K) {
  for (int64_t r = r0; r < r1; ++r) {
    T* __restrict o = out + r * K;
    for (int64_t k = k0; k < k1; ++k) o[k] = T(0);
    for (int64_t q = first[r]; q < first[r + 1]; ++q) {
      const T c = value[q];
      const T* __restrict xr = x + column[q] * K;
      for (int64_t k = k0; k < k1; ++k) o[k] += c * xr[k];
    }
  }
}

#define CRUCIBLE_COMBINE_INSTANCE(T, NAME)                                                                   \
  CRUCIBLE_SIMD_CLONES void combine_##NAME(const int64_t* first, const int64_t* column, const T* value,     \
                                           const T* x, T* out, int64_t r0, int64_t r1, int64_t k0,          \
                                           int64_t k1, int64_t K) {                                         \
    combine_kernel<T>(first, column, value, x, out, r0, r1, k0, k1, K);                                     \
  }                                                                                                         \
  inline void combine_any(const int64_t* first, const int64_t* column, const T* value, const T* x, T* out,  \
                          int64_t r0, int64_t r1, int64_t k0, int64_t k1, int64_t K) {                      \
    combine_##NAME(first, column, value, x, out, r0, r1, k0, k1, K);                                        \
  }
CRUCIBLE_COMBINE_INSTANCE(float, f)
CRUCIBLE_COMBINE_INSTANCE(double, d)
#undef CRUCIBLE_COMBINE_INSTANCE

at::Tensor combine(const at::Tensor& a, const at::Tensor& x) {
  const auto t = x.scalar_type();
  if (!x.device().is_cpu() || (t != at::kFloat && t != at::kDouble)) return at::mm(a.to(x.options()), x);
  const SparseRows s = sparse_rows(a);
  const at::Tensor xc = x.contiguous();
  const int64_t R = a.size(0), K = xc.size(1);
  at::Tensor out = at::empty({R, K}, xc.options());
  // Column blocks of 2048 elements: one block of an output row stays in
  // cache while the rows of x it reads stream past; blocks run in parallel.
  constexpr int64_t kBlock = 2048;
  const int64_t blocks = (K + kBlock - 1) / kBlock;
  AT_DISPATCH_FLOATING_TYPES(t, "sparse_row_combination", [&] {
    std::vector<scalar_t> value(s.value.begin(), s.value.end());
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        combine_any(s.first.data(), s.column.data(), value.data(), xp, op, 0, R, b * kBlock,
                    std::min(K, (b + 1) * kBlock), K);
      }
    });
  });
  return out;
}

struct SparseRowCombination : public Function<SparseRowCombination> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& x) {
    ctx->saved_data["a"] = a;
    return combine(a, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor a = ctx->saved_data["a"].toTensor();
    return {at::Tensor(), SparseRowCombination::apply(a.t().contiguous(), grads[0])};
  }
};

}  // namespace

at::Tensor sparse_row_combination(const at::Tensor& a, const at::Tensor& x) {
  if (a.dim() != 2 || x.dim() != 2 || a.size(1) != x.size(0)) {
    std::ostringstream msg;
    msg << "sparse_row_combination: expected a [R, M] and x [M, K], got a " << a.sizes() << " and x " << x.sizes();
    throw std::invalid_argument(msg.str());
  }
  return SparseRowCombination::apply(a.detach(), x);
}

}  // namespace crucible
