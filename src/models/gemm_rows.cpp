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

// x cast to bfloat16 with dim 0 padded by zero rows to its bucket.
at::Tensor padded_bf16(const at::Tensor& x) {
  const int64_t rows = x.size(0), padded = gemm_row_bucket(rows);
  at::Tensor xb = x.to(at::kBFloat16);
  if (padded == rows) return xb;
  std::vector<int64_t> pad(static_cast<size_t>(2 * x.dim()), 0);
  pad.back() = padded - rows;  // constant_pad_nd's pairs run from the last dim to the first
  return at::constant_pad_nd(xb, pad);
}

}  // namespace

at::Tensor linear_bucketed_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (x.dim() != 2 || !cpu_bf16_gemm(x, weight)) return at::linear(x, weight, bias);
  if (gemm_row_bucket(x.size(0)) == x.size(0)) return at::linear(x, weight, bias);  // no pad, no slice
  return at::linear(padded_bf16(x), weight, bias).narrow(0, 0, x.size(0));
}

at::Tensor matmul_bucketed_rows(const at::Tensor& x, const at::Tensor& w) {
  if (x.dim() < 2 || w.dim() != 2 || !cpu_bf16_gemm(x, w)) return at::matmul(x, w);
  if (gemm_row_bucket(x.size(0)) == x.size(0)) return at::matmul(x, w);
  return at::matmul(padded_bf16(x), w).narrow(0, 0, x.size(0));
}

}  // namespace crucible
