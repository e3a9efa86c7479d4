// Row buckets for bfloat16 CPU matrix products.

#include "crucible/models/gemm_rows.h"

#include "crucible/common/autocast_state.h"

#include <c10/util/Exception.h>

#include <vector>

namespace crucible {

int64_t gemm_row_bucket(int64_t rows) {
  TORCH_CHECK(rows >= 0, "gemm_row_bucket: rows must be >= 0, got ", rows);
  if (rows <= 16) return rows;
  int log2 = 0;
  while ((int64_t{1} << (log2 + 1)) <= rows) ++log2;
  const int64_t step = int64_t{1} << (log2 - 4);
  return (rows + step - 1) / step * step;
}

bool cpu_bf16_gemm(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.defined() || !weight.defined() || !x.device().is_cpu()) return false;
  if (x.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kBFloat16) return true;
  return autocast_enabled(at::kCPU) && autocast_dtype(at::kCPU) == at::kBFloat16 &&
         at::isFloatingType(x.scalar_type());
}

namespace {

// product(x') with x' = x cast to bfloat16 and dim 0 padded by zero rows to
// its bucket, cut back to x's rows; product(x) itself where no bf16 CPU
// product runs (`bf16`) or x already has a bucket's rows.
template <class Product>
at::Tensor with_bucketed_rows(const at::Tensor& x, bool bf16, Product product) {
  const int64_t rows = x.size(0), padded = gemm_row_bucket(rows);
  if (!bf16 || padded == rows) return product(x);
  std::vector<int64_t> pad(static_cast<size_t>(2 * x.dim()), 0);
  pad.back() = padded - rows;  // constant_pad_nd's pairs run from the last dim to the first
  return product(at::constant_pad_nd(x.to(at::kBFloat16), pad)).narrow(0, 0, rows);
}

}  // namespace

at::Tensor linear_bucketed_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (x.dim() != 2) return at::linear(x, weight, bias);
  if (weight.dim() == 2 && row_chunked_gemm(x, weight.t())) {
    return mm_row_chunks(x, weight.t(), bias, gemm_chunk_rows(weight.size(1), weight.size(0), x.element_size()));
  }
  return with_bucketed_rows(x, cpu_bf16_gemm(x, weight),
                            [&](const at::Tensor& in) { return at::linear(in, weight, bias); });
}

at::Tensor matmul_bucketed_rows(const at::Tensor& x, const at::Tensor& w) {
  if (x.dim() < 2 || w.dim() != 2) return at::matmul(x, w);
  if (row_chunked_gemm(x, w) && x.is_contiguous()) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = w.size(1);
    const int64_t chunk = gemm_chunk_rows(w.size(0), w.size(1), x.element_size());
    return mm_row_chunks(x.view({-1, x.size(-1)}), w, at::Tensor(), chunk).view(shape);
  }
  return with_bucketed_rows(x, cpu_bf16_gemm(x, w), [&](const at::Tensor& in) { return at::matmul(in, w); });
}

}  // namespace crucible
