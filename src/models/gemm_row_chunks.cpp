// Row-chunked CPU matrix products with derivatives of any order.

#include "crucible/models/gemm_rows.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>

namespace crucible {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// Bytes of one chunk's rows of x and y together: within a 2 MiB L2 with
// the packed weight beside them. Row chunks of 4096-16384 rows of
// [·,64]×[64,64] ran at the same speed here (Zen 5, 1 thread).
constexpr int64_t kChunkBytes = int64_t{4} << 20;

// y = x w (+ bias), `chunk` rows of x at a time into one y.
at::Tensor chunked_product(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, int64_t chunk) {
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0);
  at::Tensor y = at::empty({M, w.size(1)}, xc.options());
  for (int64_t b = 0; b < M; b += chunk) {
    const int64_t n = std::min(chunk, M - b);
    at::Tensor out = y.narrow(0, b, n);
    if (bias.defined()) {
      at::addmm_out(out, bias, xc.narrow(0, b, n), w);
    } else {
      at::mm_out(out, xc.narrow(0, b, n), w);
    }
  }
  return y;
}

// Row-sized products of a derivative: y = x w without a bias. (LibTorch
// 1.13's Function::apply cannot take an undefined tensor argument, so the
// biased product is its own node.)
at::Tensor product_rows(const at::Tensor& x, const at::Tensor& w, int64_t chunk);

// out = aᵀ b; a [M,K], b [M,N] → [K,N] (the weight gradient of a product).
struct TransposedProduct : Function<TransposedProduct> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, int64_t chunk) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["chunk"] = chunk;
    return at::mm(a.t(), b);  // a sum over rows: no faster in chunks here
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor& g = grads[0];  // [K,N]
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = product_rows(saved[1], g.t(), chunk);  // b gᵀ
    if (ctx->needs_input_grad(1)) gb = product_rows(saved[0], g, chunk);      // a g
    return {ga, gb, at::Tensor()};
  }
};

// The derivatives of y = x w (+ bias) by x, w and the bias.
variable_list product_grads(AutogradContext* ctx, const at::Tensor& gy, bool bias) {
  const auto saved = ctx->get_saved_variables();
  const int64_t chunk = ctx->saved_data["chunk"].toInt();
  variable_list out(bias ? 4 : 3);
  if (ctx->needs_input_grad(0)) out[0] = product_rows(gy, saved[1].t(), chunk);     // gy wᵀ
  if (ctx->needs_input_grad(1)) out[1] = TransposedProduct::apply(saved[0], gy, chunk);  // xᵀ gy
  if (bias && ctx->needs_input_grad(2)) out[2] = gy.sum(0);
  return out;
}

// y = x w; x [M,K], w [K,N].
struct RowChunkedProduct : Function<RowChunkedProduct> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t chunk) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["chunk"] = chunk;
    return chunked_product(x, w, at::Tensor(), chunk);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return product_grads(ctx, grads[0], false);
  }
};

// y = x w + bias; bias [N].
struct RowChunkedBiasedProduct : Function<RowChunkedBiasedProduct> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                            int64_t chunk) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["chunk"] = chunk;
    return chunked_product(x, w, bias, chunk);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return product_grads(ctx, grads[0], true);
  }
};

at::Tensor product_rows(const at::Tensor& x, const at::Tensor& w, int64_t chunk) {
  return RowChunkedProduct::apply(x, w, chunk);
}

}  // namespace

int64_t gemm_chunk_rows(int64_t in_features, int64_t out_features, int64_t element_size) {
  TORCH_CHECK(in_features > 0 && out_features > 0 && element_size > 0,
              "gemm_chunk_rows: features and element size must be positive, got ", in_features, ", ",
              out_features, ", ", element_size);
  return std::max<int64_t>(256, kChunkBytes / ((in_features + out_features) * element_size));
}

at::Tensor mm_row_chunks(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, int64_t chunk_rows) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(0), "mm_row_chunks: x [M,K] and w [K,N] expected, got ",
              x.sizes(), " and ", w.sizes());
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(1)), "mm_row_chunks: bias must be [",
              w.size(1), "]");
  TORCH_CHECK(chunk_rows >= 1, "mm_row_chunks: chunk_rows must be >= 1, got ", chunk_rows);
  return bias.defined() ? RowChunkedBiasedProduct::apply(x, w, bias, chunk_rows)
                        : RowChunkedProduct::apply(x, w, chunk_rows);
}

bool row_chunked_gemm(const at::Tensor& x, const at::Tensor& w) {
  if (!x.defined() || !w.defined() || x.dim() < 2 || w.dim() != 2) return false;
  if (!x.device().is_cpu() || !w.device().is_cpu() || x.scalar_type() != w.scalar_type()) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) return false;
  if (cpu_bf16_gemm(x, w)) return false;
  const int64_t rows = x.numel() / x.size(-1);
  return rows > 2 * gemm_chunk_rows(w.size(0), w.size(1), x.element_size());
}

}  // namespace crucible
