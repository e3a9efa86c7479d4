// MACE's coupling tables taken from a model file (MaceOptions::basis "mace",
// issue 46; docs/mace_import.md): the e3nn Clebsch-Gordan blocks of the edge
// tensor product and the U matrices of the symmetric contraction are buffers
// of the model, and the fast-path tables are rebuilt from them.

#include "crucible/models/mace/mace.h"
#include "crucible/models/mace/product_basis_engine.h"
#include "crucible/models/mace/radial.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>

namespace crucible {
namespace {

/// e3nn's coupling where an l is 0 (its specialised code in
/// o3/_tensor_product/_codegen.py): δ / √(2l+1) over the two equal l,
/// [2l1+1, 2l2+1, 2l3+1] float64.
at::Tensor scalar_coupling(int l1, int l2, int l3) {
  const int l = l1 == 0 ? l2 : l1;
  const int64_t d = 2 * l + 1;
  const at::Tensor eye = at::eye(d, at::kDouble) / std::sqrt(static_cast<double>(d));
  return eye.reshape({2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1});
}

std::string w3j_key(int l1, int l2, int l3) {
  return std::to_string(l1) + "_" + std::to_string(l2) + "_" + std::to_string(l3);
}

}  // namespace

void MaceImpl::stack_product_tables(Layer& L) {
  L.stacked_coefficients.clear();
  L.monomial_indices.clear();
  for (int nu = 1; nu <= L.table->max_nu; ++nu) {
    std::vector<at::Tensor> rows;
    for (const auto& cmat : L.table->coefficients[static_cast<size_t>(nu - 1)])
      if (cmat.defined()) rows.push_back(cmat);
    L.stacked_coefficients.push_back(rows.empty() ? at::Tensor() : at::cat(rows, 0));
    L.monomial_indices.push_back(nu == 1 ? L.table->monomials[0].select(1, 0).contiguous()
                                         : L.table->parents[static_cast<size_t>(nu - 1)]);
  }
  L.engine_plan = std::make_shared<const mace::ProductBasisPlan>(mace::product_basis_plan(*L.table));
}

double MaceImpl::silu_factor() const {
  return options_.silu_normalization > 0.0 ? options_.silu_normalization : mace::normalized_silu_factor();
}

void MaceImpl::register_file_tables(const Layer& L, int64_t t, const std::string& prefix) {
  const size_t ts = static_cast<size_t>(t);
  const int64_t D = L.target.dim();
  auto& per_out = u_matrices_[ts];
  per_out.assign(L.out.size(), {});
  for (size_t b = 0; b < L.out.size(); ++b) {
    const mace::Irrep& out = L.out.terms()[b].irrep;
    int64_t Dn = 1;
    for (int nu = 1; nu <= options_.correlation; ++nu) {
      Dn *= D;
      const int64_t K = options_.u_columns[ts][b][static_cast<size_t>(nu - 1)];
      per_out[b].push_back(K == 0 ? at::Tensor()
                                  : register_buffer(prefix + "U_matrix_" + out.to_string() + "_nu" + std::to_string(nu),
                                                    at::zeros({out.dim(), Dn, K}, at::kFloat)));
    }
  }
  for (const auto& path : L.tp->paths()) {
    const int l1 = L.node.terms()[path.in_term].irrep.l, l2 = path.sh_l, l3 = path.out.l;
    if (l1 == 0 || l2 == 0 || l3 == 0) continue;
    const std::array<int, 3> key{l1, l2, l3};
    if (w3j_[ts].count(key)) continue;
    w3j_[ts][key] = register_buffer(prefix + "w3j_" + w3j_key(l1, l2, l3),
                                    at::zeros({2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1}, at::kFloat));
  }
}

void MaceImpl::refresh_file_tables() {
  std::lock_guard<std::mutex> lock(*file_tables_mutex_);
  std::vector<std::pair<const void*, int64_t>> signature;
  for (const auto& per_out : u_matrices_)
    for (const auto& per_nu : per_out)
      for (const auto& U : per_nu)
        if (U.defined()) signature.emplace_back(U.data_ptr(), static_cast<int64_t>(U._version()));
  for (const auto& blocks : w3j_)
    for (const auto& [key, w] : blocks) signature.emplace_back(w.data_ptr(), static_cast<int64_t>(w._version()));
  if (signature == file_tables_signature_) return;

  for (size_t t = 0; t < layers_.size(); ++t) {
    Layer& L = layers_[t];
    const auto& blocks = w3j_[t];
    L.tp = std::make_shared<mace::ConvTensorProduct>(
        L.node, options_.max_ell, L.target, [&blocks](int l1, int l2, int l3) {
          if (l1 == 0 || l2 == 0 || l3 == 0) return scalar_coupling(l1, l2, l3);
          return blocks.at({l1, l2, l3}).to(at::kCPU, at::kDouble);
        });
    L.owned_bases.clear();
    L.bases.clear();
    std::vector<std::vector<const mace::SymmetricBasis*>> by_out(L.out.size());
    const int64_t D = L.target.dim();
    for (size_t b = 0; b < L.out.size(); ++b) {
      const mace::Irrep& out = L.out.terms()[b].irrep;
      int64_t Dn = 1;
      for (int nu = 1; nu <= options_.correlation; ++nu) {
        Dn *= D;
        const at::Tensor& U = u_matrices_[t][b][static_cast<size_t>(nu - 1)];
        auto basis = std::make_shared<mace::SymmetricBasis>();
        if (U.defined()) {
          *basis = mace::symmetric_basis_from_dense(out, nu, D, U.detach());
        } else {  // no term of this degree
          basis->out = out;
          basis->nu = nu;
          basis->in_dim = D;
          basis->dense = at::zeros({out.dim(), Dn, 0}, at::kDouble);
          basis->monomials = at::zeros({0, nu}, at::kLong);
          basis->coefficients = at::zeros({0, 0}, at::kDouble);
        }
        L.owned_bases.push_back(basis);
        L.bases.push_back(basis.get());
        by_out[b].push_back(basis.get());
      }
    }
    L.table = std::make_shared<mace::MonomialTable>(mace::monomial_table(by_out, options_.correlation));
    stack_product_tables(L);
  }
  file_tables_signature_ = std::move(signature);
}

}  // namespace crucible
