// The channel-wise tensor product of MACE's interaction. See
// include/crucible/models/mace/tensor_product.h.

#include "crucible/models/mace/tensor_product.h"
#include "crucible/models/mace/clebsch_gordan.h"
#include "crucible/models/mace/edge_contraction.h"
#include "crucible/models/mace/sparse_coupling.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace crucible::mace {

ConvTensorProduct::ConvTensorProduct(const Irreps& in, int max_ell, const Irreps& target, const CouplingSource& coupling)
    : in_(in), target_(target), max_ell_(max_ell) {
  for (const auto* ir : {&in, &target}) {
    for (const auto& t : ir->terms()) {
      if (t.mul != 1) throw std::invalid_argument("ConvTensorProduct: per-channel irreps must have multiplicity 1, got " + ir->to_string());
    }
  }
  term_paths_.resize(in.size());
  for (size_t a = 0; a < in.size(); ++a) {
    const Irrep& i1 = in.terms()[a].irrep;
    for (int l2 = 0; l2 <= max_ell; ++l2) {
      const int p2 = l2 % 2 ? -1 : 1;
      for (size_t b = 0; b < target.size(); ++b) {
        const Irrep& o = target.terms()[b].irrep;
        if (o.l < std::abs(i1.l - l2) || o.l > i1.l + l2 || o.parity != i1.parity * p2) continue;
        TensorProductPath p;
        p.in_term = a;
        p.sh_l = l2;
        p.out = o;
        p.target_term = b;
        p.mid_offset = mid_dim_;
        at::Tensor c = coupling ? coupling(i1.l, l2, o.l) : real_coupling(i1.l, l2, o.l);
        if (!c.defined() || c.dim() != 3 || c.size(0) != i1.dim() || c.size(1) != 2 * l2 + 1 || c.size(2) != o.dim()) {
          throw std::invalid_argument("ConvTensorProduct: the coupling of " + std::to_string(i1.l) + " x " +
                                      std::to_string(l2) + " -> " + std::to_string(o.l) + " must have shape [" +
                                      std::to_string(i1.dim()) + ", " + std::to_string(2 * l2 + 1) + ", " +
                                      std::to_string(o.dim()) + "]");
        }
        p.coupling = c.to(at::kCPU, at::kDouble) * std::sqrt(2.0 * o.l + 1.0);
        mid_dim_ += o.dim();
        term_paths_[a].push_back(paths_.size());
        paths_.push_back(p);
      }
    }
  }
  if (paths_.empty()) {
    throw std::invalid_argument("ConvTensorProduct: no path from " + in.to_string() + " with harmonics to l = " +
                                std::to_string(max_ell) + " reaches " + target.to_string());
  }
  // Per input term: the coupling as one matrix Y → T, [Dsh, rows·(2l1+1)].
  const int64_t Dsh = (max_ell + 1) * (max_ell + 1);
  for (size_t a = 0; a < in.size(); ++a) {
    const int64_t d1 = in.terms()[a].irrep.dim();
    int64_t rows = 0;
    for (size_t pi : term_paths_[a]) rows += paths_[pi].out.dim();
    if (rows == 0) {
      term_coupling_.emplace_back();
      term_sparse_.emplace_back();
      term_row_path_.emplace_back();
      continue;
    }
    at::Tensor m = at::zeros({Dsh, rows, d1}, at::kDouble);
    at::Tensor row_path = at::zeros({rows}, at::kLong);
    int64_t r = 0;
    for (size_t pi : term_paths_[a]) {
      const auto& p = paths_[pi];
      const int64_t d2 = 2 * p.sh_l + 1, d3 = p.out.dim();
      // m[sh_off + j, r + k, i] = coupling[i, j, k]
      m.narrow(0, p.sh_l * p.sh_l, d2).narrow(1, r, d3).copy_(p.coupling.permute({1, 2, 0}));
      row_path.narrow(0, r, d3).fill_(static_cast<int64_t>(pi));
      r += d3;
    }
    term_coupling_.push_back(m.reshape({Dsh, rows * d1}));
    term_sparse_.push_back(std::make_shared<const SparseCoupling>(term_coupling_.back()));
    term_row_path_.push_back(row_path);
  }
  for (size_t a = 0; a < in.size(); ++a) {
    const int64_t first = term_paths_[a].empty() ? 0 : static_cast<int64_t>(term_paths_[a].front());
    term_path_range_.emplace_back(first, static_cast<int64_t>(term_paths_[a].size()));
    term_row_local_path_.push_back(term_row_path_[a].defined() ? term_row_path_[a] - first : at::Tensor());
  }
}

std::vector<at::Tensor> ConvTensorProduct::edge_tables(const at::Tensor& Y) const {
  std::vector<at::Tensor> out;
  const int64_t E = Y.size(0);
  for (size_t a = 0; a < in_.size(); ++a) {
    if (!term_coupling_[a].defined()) {
      out.emplace_back();
      continue;
    }
    const int64_t d1 = in_.terms()[a].irrep.dim();
    const at::Tensor m = term_coupling_[a].to(Y.options());
    out.push_back(at::matmul(Y, m).view({E, -1, d1}));  // [E, rows, 2l1+1]
  }
  return out;
}

at::Tensor ConvTensorProduct::aggregate(const at::Tensor& x, const std::vector<at::Tensor>& tables,
                                        const std::vector<at::Tensor>& term_weights, const at::Tensor& receiver,
                                        const at::Tensor& sender, const PairEdges* w_pairs) const {
  TORCH_CHECK(tables.size() == in_.size() && term_weights.size() == in_.size(),
              "ConvTensorProduct::aggregate: one table and one weight tensor per input term expected");
  const auto offsets = in_.offsets();
  const int64_t N = x.size(0), C = x.size(2);
  std::vector<at::Tensor> parts;
  for (size_t a = 0; a < in_.size(); ++a) {
    if (!tables[a].defined()) continue;
    const int64_t d1 = in_.terms()[a].irrep.dim();
    const at::Tensor xa = x.narrow(1, offsets[a], d1);
    const at::Tensor path = term_row_local_path_[a].to(x.device());
    const int64_t count = term_path_range_[a].second;
    TORCH_CHECK(term_weights[a].defined() && term_weights[a].dim() == 3 && term_weights[a].size(1) == count,
                "ConvTensorProduct::aggregate: term ", a, " weights must be [E or pairs, ", count, ", C]");
    parts.push_back(edge_contraction(EdgeSlot::kMessage, at::Tensor(), term_weights[a], tables[a], xa, receiver,
                                     sender, path, N, count, path.size(0), d1, C, w_pairs));
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
}

at::Tensor ConvTensorProduct::messages_reference(const at::Tensor& x_sender, const at::Tensor& Y,
                                                 const at::Tensor& weights) const {
  const auto offsets = in_.offsets();
  std::vector<at::Tensor> parts;
  for (size_t a = 0; a < in_.size(); ++a) {
    for (size_t pi : term_paths_[a]) {
      const auto& p = paths_[pi];
      const at::Tensor xs = x_sender.narrow(1, offsets[a], in_.terms()[a].irrep.dim());
      const at::Tensor y = Y.narrow(1, p.sh_l * p.sh_l, 2 * p.sh_l + 1);
      const at::Tensor cg = p.coupling.to(x_sender.options());
      at::Tensor m = at::einsum("eic,ijk,ej->ekc", {xs, cg, y.to(x_sender.scalar_type())});
      parts.push_back(m * weights.select(1, static_cast<int64_t>(pi)).unsqueeze(1));
    }
  }
  return at::cat(parts, 1);
}

}  // namespace crucible::mace
