// MACE ↔ Crucible tensor correspondence (issue 46). See mace_layout.h.

#include "mace_layout.h"

#include <algorithm>
#include <numeric>

namespace crucible::mace_layout {
namespace {

using mace::Irrep;

struct Path {
  size_t in_term;
  int l2;
  Irrep out;
  size_t target_term;
};

/// The edge tensor product's paths in Crucible's order (input term,
/// harmonic, output), as ConvTensorProduct builds them.
std::vector<Path> paths_of(const LayerIrreps& L, int max_ell) {
  std::vector<Path> paths;
  for (size_t a = 0; a < L.node.size(); ++a)
    for (int l2 = 0; l2 <= max_ell; ++l2)
      for (size_t b = 0; b < L.target.size(); ++b) {
        const Irrep& ir = L.target[b];
        if (ir.l < std::abs(L.node[a].l - l2) || ir.l > L.node[a].l + l2 || ir.parity != L.node[a].parity * (l2 % 2 ? -1 : 1)) continue;
        paths.push_back({a, l2, ir, b});
      }
  return paths;
}

/// A MACE tensor that is `n` equal blocks of `block` (MACE layout),
/// Crucible's k-th tensor being block k permuted by `perm` (empty = as is).
TensorMap blocks(const std::string& mace, const std::vector<std::string>& crucible, std::vector<int64_t> block,
                 std::vector<int64_t> perm = {}) {
  TensorMap m;
  m.mace = mace;
  m.crucible = crucible;
  std::vector<int64_t> split{static_cast<int64_t>(crucible.size())};
  split.insert(split.end(), block.begin(), block.end());
  int64_t numel = 1;
  for (int64_t d : split) numel *= d;
  m.mace_shape = {numel};  // e3nn stores the weights of all instructions flat
  std::vector<int64_t> inverse(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) inverse[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
  m.to_crucible = [perm, split](const at::Tensor& flat) {
    const at::Tensor x = flat.reshape(split);
    std::vector<at::Tensor> out;
    for (int64_t k = 0; k < x.size(0); ++k) out.push_back(perm.empty() ? x[k] : x[k].permute(perm));
    return out;
  };
  m.to_mace = [inverse, numel](const std::vector<at::Tensor>& parts) {
    std::vector<at::Tensor> xs;
    for (const auto& p : parts) xs.push_back(inverse.empty() ? p : p.permute(inverse));
    return at::stack(xs).reshape({numel});
  };
  return m;
}

/// One MACE tensor = one Crucible tensor of the same numbers in another shape.
TensorMap same(const std::string& mace, std::vector<int64_t> mace_shape, const std::string& crucible,
               std::vector<int64_t> crucible_shape) {
  TensorMap m;
  m.mace = mace;
  m.mace_shape = mace_shape;
  m.crucible = {crucible};
  m.to_crucible = [crucible_shape](const at::Tensor& x) { return std::vector<at::Tensor>{x.reshape(crucible_shape)}; };
  m.to_mace = [mace_shape](const std::vector<at::Tensor>& p) { return p[0].reshape(mace_shape); };
  return m;
}

}  // namespace

LayerIrreps layer_irreps(const MaceOptions& o, int64_t t) {
  const mace::Irreps hidden = mace::Irreps::parse(o.hidden_irreps, 3);
  LayerIrreps L;
  if (t == 0) L.node = {Irrep{0, 1}};
  else for (const auto& term : hidden.terms()) L.node.push_back(term.irrep);
  for (int l = 0; l <= o.max_ell; ++l) L.target.push_back(Irrep{l, l % 2 ? -1 : 1});
  if (t == o.num_interactions - 1) L.out = {Irrep{0, 1}};
  else for (const auto& term : hidden.terms()) L.out.push_back(term.irrep);
  return L;
}

std::pair<int64_t, int64_t> tp_paths(const MaceOptions& o, int64_t t) {
  const auto paths = paths_of(layer_irreps(o, t), o.max_ell);
  int64_t rows = 0;
  for (const auto& p : paths) rows += p.out.dim();
  return {static_cast<int64_t>(paths.size()), rows};
}

std::vector<TensorMap> tensor_maps(const MaceOptions& o) {
  const int64_t C = mace::Irreps::parse(o.hidden_irreps, 3).terms()[0].mul;
  const int64_t nE = static_cast<int64_t>(o.atomic_numbers.size());
  const int64_t T = o.num_interactions;
  std::vector<TensorMap> maps;
  maps.push_back(same("node_embedding.linear.weight", {nE * C}, "embedding", {nE, C}));
  if (o.pair_repulsion) {  // MACE's ZBLBasis buffers (its p is num_polynomial_cutoff)
    maps.push_back(same("pair_repulsion_fn.c", {4}, "zbl_c", {4}));
    maps.push_back(same("pair_repulsion_fn.covalent_radii", {119}, "zbl_covalent_radii", {119}));
    maps.push_back(same("pair_repulsion_fn.a_exp", {}, "zbl_a_exp", {}));
    maps.push_back(same("pair_repulsion_fn.a_prefactor", {}, "zbl_a_prefactor", {}));
  }
  for (int64_t t = 0; t < T; ++t) {
    const std::string in = "interactions." + std::to_string(t) + ".", pr = "products." + std::to_string(t) + ".";
    const std::string p = "layer" + std::to_string(t) + "_";
    const LayerIrreps L = layer_irreps(o, t);
    std::vector<std::string> names;
    for (const auto& ir : L.node) names.push_back(p + "linear_up_" + ir.to_string());
    maps.push_back(blocks(in + "linear_up.weight", names, {C, C}));

    // Radial MLP; its last layer's column blocks from MACE's slots
    // (outputs sorted by irrep, stably) to Crucible's path order.
    const std::vector<Path> paths = paths_of(L, o.max_ell);
    std::vector<size_t> order(paths.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return std::make_pair(paths[x].out.l, paths[x].out.parity) < std::make_pair(paths[y].out.l, paths[y].out.parity);
    });
    const int64_t P = static_cast<int64_t>(paths.size());
    std::vector<int64_t> cols(static_cast<size_t>(P * C)), inverse(static_cast<size_t>(P * C));
    for (size_t s = 0; s < order.size(); ++s)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t crucible_col = static_cast<int64_t>(order[s]) * C + c, mace_col = static_cast<int64_t>(s) * C + c;
        cols[static_cast<size_t>(crucible_col)] = mace_col;
        inverse[static_cast<size_t>(mace_col)] = crucible_col;
      }
    std::vector<int64_t> widths{o.num_bessel};
    for (int64_t w : o.radial_mlp) widths.push_back(w);
    widths.push_back(P * C);
    for (size_t k = 0; k + 1 < widths.size(); ++k) {
      TensorMap m = same(in + "conv_tp_weights.layer" + std::to_string(k) + ".weight", {widths[k], widths[k + 1]},
                         p + "radial_" + std::to_string(k), {widths[k], widths[k + 1]});
      if (k + 2 == widths.size()) {
        const at::Tensor to_c = at::tensor(cols, at::kLong), to_m = at::tensor(inverse, at::kLong);
        m.to_crucible = [to_c](const at::Tensor& x) { return std::vector<at::Tensor>{x.index_select(1, to_c)}; };
        m.to_mace = [to_m](const std::vector<at::Tensor>& x) { return x[0].index_select(1, to_m); };
      }
      maps.push_back(m);
    }
    // linear (messages → target): per target irrep with paths, [P_b·C, C] rows in path order.
    {
      std::vector<std::string> lin;
      std::vector<int64_t> rows;
      for (size_t b = 0; b < L.target.size(); ++b) {
        int64_t pb = 0;
        for (const auto& path : paths) pb += path.target_term == b ? 1 : 0;
        if (pb == 0) continue;
        lin.push_back(p + "linear_" + L.target[b].to_string());
        rows.push_back(pb * C);
      }
      TensorMap m;
      m.mace = in + "linear.weight";
      m.mace_shape = {P * C * C};
      m.crucible = lin;
      m.to_crucible = [rows, C](const at::Tensor& x) {
        std::vector<at::Tensor> out;
        int64_t off = 0;
        for (int64_t r : rows) {
          out.push_back(x.narrow(0, off, r * C).view({r, C}));
          off += r * C;
        }
        return out;
      };
      m.to_mace = [](const std::vector<at::Tensor>& parts) {
        std::vector<at::Tensor> flat;
        for (const auto& q : parts) flat.push_back(q.reshape({-1}));
        return at::cat(flat);
      };
      maps.push_back(m);
    }
    // skip_tp: per matching (input irrep → output irrep) a [C, nE, C] block.
    {
      const auto& from = t == 0 ? L.target : L.node;
      const auto& to = t == 0 ? L.target : L.out;
      std::vector<std::string> skip;
      for (const auto& a : from)
        for (const auto& b : to)
          if (a == b) skip.push_back(p + "skip_" + b.to_string());
      maps.push_back(blocks(in + "skip_tp.weight", skip, {C, nE, C}, {1, 0, 2}));
    }
    // Clebsch-Gordan blocks of the paths without an l = 0.
    std::vector<std::string> seen;
    for (const auto& path : paths) {
      const int l1 = L.node[path.in_term].l, l2 = path.l2, l3 = path.out.l;
      if (l1 == 0 || l2 == 0 || l3 == 0) continue;
      const std::string key = std::to_string(l1) + "_" + std::to_string(l2) + "_" + std::to_string(l3);
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      seen.push_back(key);
      const std::vector<int64_t> shape{2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1};
      maps.push_back(same(in + "conv_tp._compiled_main_left_right._w3j_" + key, shape, p + "w3j_" + key, shape));
    }
    // Product basis: per output irrep its U matrices and weights.
    const int64_t D = (o.max_ell + 1) * (o.max_ell + 1);
    for (size_t b = 0; b < L.out.size(); ++b) {
      const std::string sc = pr + "symmetric_contractions.contractions." + std::to_string(b) + ".";
      const Irrep& out = L.out[b];
      int64_t Dn = 1;
      for (int nu = 1; nu <= o.correlation; ++nu) {
        Dn *= D;
        const int64_t K = o.u_columns[static_cast<size_t>(t)][b][static_cast<size_t>(nu - 1)];
        if (K == 0) continue;
        std::vector<int64_t> ushape;  // MACE: [2L+1 (not for L = 0), D, ..., D, K]
        if (out.l > 0) ushape.push_back(out.dim());
        for (int k = 0; k < nu; ++k) ushape.push_back(D);
        ushape.push_back(K);
        maps.push_back(same(sc + "U_matrix_" + std::to_string(nu), ushape,
                            p + "U_matrix_" + out.to_string() + "_nu" + std::to_string(nu), {out.dim(), Dn, K}));
        const std::string w = nu == o.correlation ? sc + "weights_max" : sc + "weights." + std::to_string(o.correlation - 1 - nu);
        maps.push_back(same(w, {nE, K, C}, p + "product_" + out.to_string() + "_nu" + std::to_string(nu), {nE, K, C}));
      }
    }
    std::vector<std::string> plin;
    for (const auto& ir : L.out) plin.push_back(p + "product_linear_" + ir.to_string());
    maps.push_back(blocks(pr + "linear.weight", plin, {C, C}));
    const std::string ro = "readouts." + std::to_string(t) + ".";
    if (t < T - 1) {
      maps.push_back(same(ro + "linear.weight", {C}, p + "readout", {C, 1}));
    } else {
      maps.push_back(same(ro + "linear_1.weight", {C * o.readout_mlp}, p + "readout_mlp_0", {C, o.readout_mlp}));
      maps.push_back(same(ro + "linear_2.weight", {o.readout_mlp}, p + "readout_mlp_1", {o.readout_mlp, 1}));
    }
  }
  return maps;
}

}  // namespace crucible::mace_layout
