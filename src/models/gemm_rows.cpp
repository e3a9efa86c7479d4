// Row buckets for bfloat16 CPU matrix products.

#include "crucible/models/gemm_rows.h"

#include "crucible/common/autocast_state.h"

#include <c10/util/Exception.h>

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

at::Tensor linear_bucketed_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (x.dim() != 2 || !cpu_bf16_gemm(x, weight)) return at::linear(x, weight, bias);
  const int64_t rows = x.size(0);
  const int64_t padded = gemm_row_bucket(rows);
  at::Tensor xb = x.to(at::kBFloat16);
  if (padded != rows) xb = at::constant_pad_nd(xb, {0, 0, 0, padded - rows});
  return at::linear(xb, weight, bias).narrow(0, 0, rows);
}

}  // namespace crucible
