// Element-dependent linear maps of MACE. See
// include/crucible/models/mace/element_linear.h.

#include "crucible/models/mace/element_linear.h"
#include "crucible/models/gemm_rows.h"

#include <cmath>
#include <tuple>
#include <vector>

namespace crucible::mace {

at::Tensor element_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& elem) {
  const int64_t nE = W.size(0), C = W.size(1), Co = W.size(2), N = x.size(0), d = x.size(1);
  const double norm = 1.0 / std::sqrt(static_cast<double>(nE * C));
  if (nE == 1) return matmul_bucketed_rows(x, W[0] * norm);
  if (nE <= 8) {
    const at::Tensor all = matmul_bucketed_rows(x, (W * norm).permute({1, 0, 2}).reshape({C, nE * Co})).view({N, d, nE, Co});
    return all.gather(2, elem.view({N, 1, 1, 1}).expand({N, d, 1, Co})).squeeze(2);
  }
  if (N == 0) return at::zeros({0, d, Co}, x.options());
  const at::Tensor elem_cpu = elem.to(at::kCPU);
  const auto sorted = elem_cpu.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  const auto groups = at::unique_consecutive(std::get<0>(sorted), /*return_inverse=*/false, /*return_counts=*/true);
  const at::Tensor values = std::get<0>(groups), counts = std::get<2>(groups);
  const int64_t* v = values.data_ptr<int64_t>();
  const int64_t* n = counts.data_ptr<int64_t>();
  if (values.size(0) == 1) return matmul_bucketed_rows(x, W[v[0]] * norm);
  const at::Tensor perm = std::get<1>(sorted).to(x.device());
  const at::Tensor xs = x.index_select(0, perm);
  std::vector<at::Tensor> parts;
  for (int64_t k = 0, row = 0; k < values.size(0); row += n[k], ++k)
    parts.push_back(matmul_bucketed_rows(xs.narrow(0, row, n[k]), W[v[k]] * norm));
  const at::Tensor inverse = at::empty_like(perm).scatter_(0, perm, at::arange(N, perm.options()));
  return at::cat(parts, 0).index_select(0, inverse);
}

}  // namespace crucible::mace
