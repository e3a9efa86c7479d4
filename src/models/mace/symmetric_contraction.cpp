// The symmetric contraction (MACE's product basis). See
// include/crucible/models/mace/symmetric_contraction.h.

#include "crucible/models/mace/symmetric_contraction.h"
#include "crucible/models/cfconv.h"
#include "crucible/models/mace/clebsch_gordan.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

namespace crucible::mace {
namespace {

/// A coupled tensor of k inputs: [D^k, 2L+1] float64 with its irrep.
struct Coupled {
  at::Tensor t;
  int l = 0;
  int parity = 1;
};

/// E_t [D, 2l+1]: the embedding of term t's components into V.
at::Tensor embedding_of(const Irreps& in, size_t term) {
  const auto offsets = in.offsets();
  const auto& ir = in.terms()[term].irrep;
  at::Tensor e = at::zeros({in.dim(), ir.dim()}, at::kDouble);
  e.narrow(0, offsets[term], ir.dim()).copy_(at::eye(ir.dim(), at::kDouble));
  return e;
}

std::vector<int64_t> permutation_axes(int nu, int which) {
  // Permutations of the ν input axes (axes 1..ν of [O, D, ..., D]).
  std::vector<int64_t> axes(static_cast<size_t>(nu));
  for (int a = 0; a < nu; ++a) axes[static_cast<size_t>(a)] = a;
  for (int w = 0; w < which; ++w) std::next_permutation(axes.begin(), axes.end());
  std::vector<int64_t> full{0};
  for (int64_t a : axes) full.push_back(a + 1);
  return full;
}

int factorial(int n) { return n <= 1 ? 1 : n * factorial(n - 1); }

/// The monomials of a basis and their coefficients from its dense U
/// [O, D^ν, K], which must be symmetric in its input indices.
void fill_monomials(SymmetricBasis& basis) {
  const int nu = basis.nu;
  const int64_t D = basis.in_dim, O = basis.out.dim();
  int64_t Dn = 1;
  for (int k = 0; k < nu; ++k) Dn *= D;
  const at::Tensor& dense = basis.dense;

  // Monomials: sorted index tuples with a non-zero coefficient.
  std::vector<std::vector<int64_t>> monos;
  std::vector<at::Tensor> coefs;
  if (basis.num_basis > 0) {
    const at::Tensor flat = dense.permute({1, 0, 2}).reshape({Dn, O * basis.num_basis});  // [D^ν, O·K]
    std::vector<int64_t> idx(static_cast<size_t>(nu), 0);
    std::function<void(int, int64_t)> rec = [&](int pos, int64_t start) {
      if (pos == nu) {
        int64_t lin = 0;
        for (int64_t v : idx) lin = lin * D + v;
        // Number of distinct permutations of the tuple.
        std::map<int64_t, int> counts;
        for (int64_t v : idx) ++counts[v];
        int mult = factorial(nu);
        for (const auto& [v, n] : counts) mult /= factorial(n);
        const at::Tensor row = flat[lin] * static_cast<double>(mult);
        if (row.abs().max().item<double>() > 1e-12) {
          monos.push_back(idx);
          coefs.push_back(row);
        }
        return;
      }
      for (int64_t v = start; v < D; ++v) {
        idx[static_cast<size_t>(pos)] = v;
        rec(pos + 1, v);
      }
    };
    rec(0, 0);
  }
  basis.monomials = at::zeros({static_cast<int64_t>(monos.size()), nu}, at::kLong);
  for (size_t m = 0; m < monos.size(); ++m)
    for (int k = 0; k < nu; ++k) basis.monomials[static_cast<int64_t>(m)][k] = monos[m][static_cast<size_t>(k)];
  basis.coefficients = coefs.empty() ? at::zeros({0, O * basis.num_basis}, at::kDouble) : at::stack(coefs);
}

SymmetricBasis build_basis(const Irreps& in, const Irrep& out, int nu) {
  const int64_t D = in.dim();
  const int lmax = in.lmax();
  // All coupled tensors of 1..ν inputs, pruned to what can still reach out.l.
  std::vector<Coupled> level;
  for (size_t t = 0; t < in.size(); ++t) {
    const auto& ir = in.terms()[t].irrep;
    if (ir.l <= out.l + (nu - 1) * lmax) level.push_back({embedding_of(in, t), ir.l, ir.parity});
  }
  for (int k = 1; k < nu; ++k) {
    std::vector<Coupled> next;
    const int remaining = nu - k - 1;  // inputs still to come after this one
    for (const auto& c : level) {
      for (size_t t = 0; t < in.size(); ++t) {
        const auto& ir = in.terms()[t].irrep;
        const at::Tensor e = embedding_of(in, t);
        for (int L = std::abs(c.l - ir.l); L <= std::min(c.l + ir.l, 8); ++L) {
          if (std::abs(L - out.l) > remaining * lmax) continue;
          const at::Tensor cg = real_coupling(c.l, ir.l, L);  // [a, b, 2L+1]
          // T'[X, d, m] = Σ_ab T[X, a] E[d, b] C[a, b, m]
          at::Tensor tn = at::einsum("xa,db,abm->xdm", {c.t, e, cg}).reshape({-1, 2 * L + 1});
          next.push_back({tn, L, c.parity * ir.parity});
        }
      }
    }
    level = std::move(next);
  }
  SymmetricBasis basis;
  basis.out = out;
  basis.nu = nu;
  basis.in_dim = D;
  const int64_t O = out.dim();
  int64_t Dn = 1;
  for (int k = 0; k < nu; ++k) Dn *= D;
  std::vector<at::Tensor> rows;
  std::vector<int64_t> shape{O};
  for (int k = 0; k < nu; ++k) shape.push_back(D);
  for (const auto& c : level) {
    if (c.l != out.l || c.parity != out.parity) continue;
    at::Tensor u = c.t.t().reshape(shape);  // [O, D, ..., D]
    at::Tensor sym = at::zeros_like(u);
    const int nperm = factorial(nu);
    for (int p = 0; p < nperm; ++p) sym += u.permute(permutation_axes(nu, p));
    rows.push_back((sym / nperm).reshape({-1}));
  }
  // An orthonormal basis of their span by modified Gram-Schmidt in path
  // order, keeping a path only if it adds a direction (residual above 1e-9
  // of its norm). Unlike an SVD, whose basis within degenerate singular
  // values depends on the LAPACK/BLAS kernels, this is the same on every
  // machine to rounding, so trained weights mean the same everywhere.
  std::vector<at::Tensor> kept;
  for (const at::Tensor& row : rows) {
    const double norm = row.norm().item<double>();
    if (!(norm > 1e-12)) continue;
    at::Tensor v = row.clone();
    for (int pass = 0; pass < 2; ++pass)  // twice: re-orthogonalisation
      for (const at::Tensor& q : kept) v -= v.dot(q) * q;
    const double residual = v.norm().item<double>();
    if (residual > 1e-9 * norm) kept.push_back(v / residual);
  }
  at::Tensor dense = at::zeros({O, Dn, 0}, at::kDouble);
  if (!kept.empty()) {
    const int64_t K = static_cast<int64_t>(kept.size());
    dense = at::stack(kept).reshape({K, O, Dn}).permute({1, 2, 0}).contiguous();  // [O, D^ν, K]
  }
  basis.dense = dense;
  basis.num_basis = dense.size(2);
  fill_monomials(basis);
  return basis;
}

}  // namespace

const SymmetricBasis& symmetric_basis(const Irreps& in, const Irrep& out, int nu) {
  if (nu < 1 || nu > 3) throw std::invalid_argument("symmetric_basis: correlation order must be in 1..3, got " + std::to_string(nu));
  for (const auto& t : in.terms()) {
    if (t.mul != 1) throw std::invalid_argument("symmetric_basis: every multiplicity of the per-channel irreps must be 1, got " + in.to_string());
    if (t.irrep.l > 3) throw std::invalid_argument("symmetric_basis: l must be <= 3, got " + in.to_string());
  }
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<SymmetricBasis>> cache;
  const std::string key = in.to_string() + "|" + out.to_string() + "|" + std::to_string(nu);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, std::make_unique<SymmetricBasis>(build_basis(in, out, nu))).first;
  }
  return *it->second;
}

at::Tensor symmetric_contraction_reference(const at::Tensor& x,
                                           const std::vector<const SymmetricBasis*>& bases,
                                           const std::vector<at::Tensor>& weights) {
  const int64_t N = x.size(0), D = x.size(1), C = x.size(2);
  at::Tensor y;
  for (size_t v = 0; v < bases.size(); ++v) {
    const SymmetricBasis& b = *bases[v];
    if (b.num_basis == 0) continue;
    const int64_t O = b.out.dim(), K = b.num_basis;
    const at::Tensor U = b.dense.to(x.options());
    at::Tensor term;
    if (b.nu == 1) {
      term = at::einsum("oik,nkc,nic->noc", {U.view({O, D, K}), weights[v], x});
    } else if (b.nu == 2) {
      term = at::einsum("oijk,nkc,nic,njc->noc", {U.view({O, D, D, K}), weights[v], x, x});
    } else {
      term = at::einsum("oijlk,nkc,nic,njc,nlc->noc", {U.view({O, D, D, D, K}), weights[v], x, x, x});
    }
    y = y.defined() ? y + term : term;
  }
  if (!y.defined()) {
    const int64_t O = bases.empty() ? 1 : bases[0]->out.dim();
    y = at::zeros({N, O, C}, x.options());
  }
  return y;
}

SymmetricBasis symmetric_basis_from_dense(const Irrep& out, int nu, int64_t in_dim, const at::Tensor& U) {
  if (nu < 1 || nu > 3) throw std::invalid_argument("symmetric_basis_from_dense: correlation order must be in 1..3, got " + std::to_string(nu));
  int64_t Dn = 1;
  for (int k = 0; k < nu; ++k) Dn *= in_dim;
  if (!U.defined() || U.dim() != 3 || U.size(0) != out.dim() || U.size(1) != Dn) {
    throw std::invalid_argument("symmetric_basis_from_dense: U for " + out.to_string() + " at correlation " +
                                std::to_string(nu) + " must have shape [" + std::to_string(out.dim()) + ", " +
                                std::to_string(Dn) + ", K]");
  }
  SymmetricBasis basis;
  basis.out = out;
  basis.nu = nu;
  basis.in_dim = in_dim;
  basis.num_basis = U.size(2);
  // Symmetrised over the input indices: contracting with x ⊗ ... ⊗ x sees
  // only this part, and fill_monomials reads one ordering per monomial.
  std::vector<int64_t> shape{out.dim()};
  for (int k = 0; k < nu; ++k) shape.push_back(in_dim);
  shape.push_back(basis.num_basis);
  const at::Tensor u = U.to(at::kCPU, at::kDouble).reshape(shape);
  at::Tensor sym = at::zeros_like(u);
  const int nperm = factorial(nu);
  for (int p = 0; p < nperm; ++p) {
    std::vector<int64_t> axes = permutation_axes(nu, p);
    axes.push_back(nu + 1);
    sym += u.permute(axes);
  }
  basis.dense = (sym / nperm).reshape({out.dim(), Dn, basis.num_basis}).contiguous();
  fill_monomials(basis);
  return basis;
}

MonomialTable monomial_table(const Irreps& in, const std::vector<Irrep>& outs, int max_nu) {
  std::vector<std::vector<const SymmetricBasis*>> bases(outs.size());
  for (size_t o = 0; o < outs.size(); ++o)
    for (int nu = 1; nu <= max_nu; ++nu) bases[o].push_back(&symmetric_basis(in, outs[o], nu));
  return monomial_table(bases, max_nu);
}

MonomialTable monomial_table(const std::vector<std::vector<const SymmetricBasis*>>& bases, int max_nu) {
  for (const auto& per_out : bases) {
    if (per_out.size() != static_cast<size_t>(max_nu)) {
      throw std::invalid_argument("monomial_table: every output needs one basis per correlation order 1.." + std::to_string(max_nu));
    }
  }
  MonomialTable table;
  table.max_nu = max_nu;
  table.monomials.resize(static_cast<size_t>(max_nu));
  table.coefficients.resize(static_cast<size_t>(max_nu));
  table.num_basis.resize(static_cast<size_t>(max_nu));
  table.out_dims.resize(static_cast<size_t>(max_nu));
  table.parents.resize(static_cast<size_t>(max_nu));
  // Needed monomials per degree, closed under prefixes (top-down).
  std::vector<std::set<std::vector<int64_t>>> needed(static_cast<size_t>(max_nu));
  for (int nu = max_nu; nu >= 1; --nu) {
    auto& set = needed[static_cast<size_t>(nu - 1)];
    for (const auto& per_out : bases) {
      const auto& b = *per_out[static_cast<size_t>(nu - 1)];
      auto acc = b.monomials.accessor<int64_t, 2>();
      for (int64_t m = 0; m < b.monomials.size(0); ++m) {
        std::vector<int64_t> t;
        for (int k = 0; k < nu; ++k) t.push_back(acc[m][k]);
        set.insert(t);
      }
    }
    if (nu < max_nu) {
      for (const auto& t : needed[static_cast<size_t>(nu)]) set.insert(std::vector<int64_t>(t.begin(), t.end() - 1));
    }
  }
  for (int nu = 1; nu <= max_nu; ++nu) {
    const auto& set = needed[static_cast<size_t>(nu - 1)];
    std::vector<std::vector<int64_t>> list(set.begin(), set.end());
    std::map<std::vector<int64_t>, int64_t> row_of;
    at::Tensor mono = at::zeros({static_cast<int64_t>(list.size()), nu}, at::kLong);
    for (size_t m = 0; m < list.size(); ++m) {
      row_of[list[m]] = static_cast<int64_t>(m);
      for (int k = 0; k < nu; ++k) mono[static_cast<int64_t>(m)][k] = list[m][static_cast<size_t>(k)];
    }
    table.monomials[static_cast<size_t>(nu - 1)] = mono;
    if (nu >= 2) {
      std::map<std::vector<int64_t>, int64_t> prev_row;
      const at::Tensor prev = table.monomials[static_cast<size_t>(nu - 2)];
      for (int64_t m = 0; m < prev.size(0); ++m) {
        std::vector<int64_t> t;
        for (int k = 0; k < nu - 1; ++k) t.push_back(prev[m][k].item<int64_t>());
        prev_row[t] = m;
      }
      at::Tensor parents = at::zeros({static_cast<int64_t>(list.size()), 2}, at::kLong);
      for (size_t m = 0; m < list.size(); ++m) {
        parents[static_cast<int64_t>(m)][0] = prev_row.at(std::vector<int64_t>(list[m].begin(), list[m].end() - 1));
        parents[static_cast<int64_t>(m)][1] = list[m].back();
      }
      table.parents[static_cast<size_t>(nu - 1)] = parents;
    }
    for (const auto& per_out : bases) {
      const auto& b = *per_out[static_cast<size_t>(nu - 1)];
      const Irrep& out = b.out;
      table.num_basis[static_cast<size_t>(nu - 1)].push_back(b.num_basis);
      table.out_dims[static_cast<size_t>(nu - 1)].push_back(out.dim());
      if (b.num_basis == 0) {
        table.coefficients[static_cast<size_t>(nu - 1)].push_back(at::Tensor());
        continue;
      }
      at::Tensor p = at::zeros({out.dim() * b.num_basis, static_cast<int64_t>(list.size())}, at::kDouble);
      auto acc = b.monomials.accessor<int64_t, 2>();
      for (int64_t m = 0; m < b.monomials.size(0); ++m) {
        std::vector<int64_t> t;
        for (int k = 0; k < nu; ++k) t.push_back(acc[m][k]);
        p.select(1, row_of.at(t)).copy_(b.coefficients[m]);
      }
      table.coefficients[static_cast<size_t>(nu - 1)].push_back(p);
    }
  }
  return table;
}

namespace {

/// The monomials of degree v + 1 [M, N·C] from those of degree v (`prev`
/// [M', N·C], unused for v = 0) and the inputs `xt` [D, N·C]: degree 1 picks
/// rows of xt; above, mono[m] = prev[par[m, 0]] ⊙ xt[par[m, 1]] as one fused
/// gather-multiply (cfconv.h's edge_product over rows of N·C, derivatives of
/// every order by the same fused loops): no gathered copies, no scatter.
at::Tensor monomials_of_degree(const at::Tensor& prev, const at::Tensor& xt, const std::vector<at::Tensor>& indices,
                               size_t v) {
  if (v == 0) return xt.index_select(0, indices[0]);
  const at::Tensor& par = indices[v];  // [M, 2]
  return edge_product(prev, xt, par.select(1, 0).contiguous(), par.select(1, 1).contiguous());
}

}  // namespace

std::vector<at::Tensor> symmetric_contraction_fast(const at::Tensor& x, const MonomialTable& table,
                                                   const std::vector<at::Tensor>& stacked_coeffs,
                                                   const std::vector<at::Tensor>& indices,
                                                   const std::vector<std::vector<at::Tensor>>& weights) {
  const int64_t N = x.size(0), C = x.size(2);
  const size_t num_out = weights.size();
  // Component-major layout [D, N, C]: every monomial is a contiguous [N, C]
  // slab and each degree's contraction is one 2-D GEMM [R, M] × [M, N·C].
  const at::Tensor xt = x.transpose(0, 1).contiguous();
  std::vector<at::Tensor> y(num_out);
  at::Tensor mono;  // [M_ν, N, C]
  for (int nu = 1; nu <= table.max_nu; ++nu) {
    const size_t v = static_cast<size_t>(nu - 1);
    mono = monomials_of_degree(mono.defined() ? mono.reshape({mono.size(0), N * C}) : mono,
                               xt.view({xt.size(0), N * C}), indices, v)
               .view({-1, N, C});
    if (!stacked_coeffs[v].defined()) continue;
    const at::Tensor flat = mono.view({mono.size(0), N * C});
    const at::Tensor B = at::mm(stacked_coeffs[v], flat).view({-1, N, C});  // [R, N, C]
    // One split, not a narrow per output: a narrow's backward writes a
    // zero-filled gradient of all of B ([R, N, C]) per output and adds them.
    std::vector<int64_t> rows;
    for (size_t o = 0; o < num_out; ++o) rows.push_back(table.out_dims[v][o] * table.num_basis[v][o]);
    const std::vector<at::Tensor> parts = B.split_with_sizes(rows, 0);
    for (size_t o = 0; o < num_out; ++o) {
      const int64_t K = table.num_basis[v][o], O = table.out_dims[v][o];
      if (K == 0) continue;
      const at::Tensor part = parts[o].view({O, K, N, C});
      // Σ_k B[o, k, n, c] W[n, k, c]
      const at::Tensor term = (part * weights[o][v].transpose(0, 1).unsqueeze(0)).sum(1);  // [O, N, C]
      y[o] = y[o].defined() ? y[o] + term : term;
    }
  }
  for (size_t o = 0; o < num_out; ++o) {
    y[o] = y[o].defined() ? y[o].transpose(0, 1) : at::zeros({N, table.out_dims[0][o], C}, x.options());
  }
  return y;
}

}  // namespace crucible::mace
