// Element-dependent linear maps of MACE. See
// include/crucible/models/mace/element_linear.h.

#include "crucible/models/mace/element_linear.h"
#include "crucible/models/gemm_rows.h"

#include <cmath>
#include <tuple>
#include <vector>

namespace crucible::mace {

namespace {

/// The nodes grouped by element (CPU): the elements present, in increasing
/// order, how many nodes each has, and the stable sort's permutation.
struct ElementGroups {
  at::Tensor values, counts, perm;
};

ElementGroups group_by_element(const at::Tensor& elem) {
  const at::Tensor elem_cpu = elem.to(at::kCPU);
  const auto sorted = elem_cpu.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  const auto groups = at::unique_consecutive(std::get<0>(sorted), /*return_inverse=*/false, /*return_counts=*/true);
  return {std::get<0>(groups), std::get<2>(groups), std::get<1>(sorted)};
}

/// y[n] = x[n] · weight_of(elem[n]), one GEMM per element present.
template <class WeightOf>
at::Tensor per_element_present(const at::Tensor& x, const ElementGroups& g, WeightOf weight_of) {
  const int64_t N = x.size(0);
  const int64_t* v = g.values.data_ptr<int64_t>();
  const int64_t* n = g.counts.data_ptr<int64_t>();
  if (g.values.size(0) == 1) return matmul_bucketed_rows(x, weight_of(v[0]));
  const at::Tensor perm = g.perm.to(x.device());
  const at::Tensor xs = x.index_select(0, perm);
  std::vector<at::Tensor> parts;
  for (int64_t k = 0, row = 0; k < g.values.size(0); row += n[k], ++k)
    parts.push_back(matmul_bucketed_rows(xs.narrow(0, row, n[k]), weight_of(v[k])));
  const at::Tensor inverse = at::empty_like(perm).scatter_(0, perm, at::arange(N, perm.options()));
  return at::cat(parts, 0).index_select(0, inverse);
}

}  // namespace

at::Tensor element_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& elem) {
  const int64_t nE = W.size(0), C = W.size(1), Co = W.size(2), N = x.size(0), d = x.size(1);
  const double norm = 1.0 / std::sqrt(static_cast<double>(nE * C));
  if (nE == 1) return matmul_bucketed_rows(x, W[0] * norm);
  if (nE <= 8) {
    const at::Tensor all = matmul_bucketed_rows(x, (W * norm).permute({1, 0, 2}).reshape({C, nE * Co})).view({N, d, nE, Co});
    return all.gather(2, elem.view({N, 1, 1, 1}).expand({N, d, 1, Co})).squeeze(2);
  }
  if (N == 0) return at::zeros({0, d, Co}, x.options());
  return per_element_present(x, group_by_element(elem), [&](int64_t z) { return W[z] * norm; });
}

at::Tensor element_linear_after(const at::Tensor& x, const at::Tensor& A, const at::Tensor& W,
                                const at::Tensor& elem) {
  const int64_t nE = W.size(0), C = W.size(1), Co = W.size(2), N = x.size(0), d = x.size(1);
  const double norm = 1.0 / std::sqrt(static_cast<double>(nE * C));
  if (N == 0) return at::zeros({0, d, Co}, x.options());
  if (nE == 1) return matmul_bucketed_rows(x, at::mm(A, W[0]) * norm);
  return per_element_present(x, group_by_element(elem), [&](int64_t z) { return at::mm(A, W[z]) * norm; });
}

}  // namespace crucible::mace
