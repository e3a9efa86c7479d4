// MACE (Batatia et al., NeurIPS 2022, arXiv 2206.07697). See
// include/crucible/models/mace/mace.h for the equations.

#include "crucible/models/mace/mace.h"
#include "crucible/models/silu.h"
#include "crucible/models/layer_nodes.h"
#include "crucible/models/edge_lengths.h"
#include "crucible/models/mace/chunked_interaction.h"
#include "crucible/models/mace/element_linear.h"
#include "crucible/models/mace/product_basis_engine.h"
#include "crucible/models/chunk_parallel.h"
#include "crucible/models/cfconv.h"
#include "crucible/models/mace/radial.h"
#include "crucible/models/gemm_rows.h"
#include "crucible/models/mace/spherical_harmonics.h"
#include "crucible/models/zbl.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>

namespace crucible {
namespace {

using mace::Irrep;
using mace::Irreps;

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("MaceOptions: " + what); }

/// Per-channel irreps: every multiplicity 1.
Irreps per_channel(const std::vector<Irrep>& irreps) {
  std::vector<mace::MulIrrep> terms;
  for (const auto& ir : irreps) terms.push_back({1, ir});
  return Irreps(terms);
}

/// The harmonics' irreps 0e + 1o + ... to max_ell.
Irreps sh_irreps(int max_ell) {
  std::vector<Irrep> v;
  for (int l = 0; l <= max_ell; ++l) v.push_back({l, l % 2 ? -1 : 1});
  return per_channel(v);
}

std::vector<Irrep> irreps_of(const Irreps& x) {
  std::vector<Irrep> v;
  for (const auto& t : x.terms()) v.push_back(t.irrep);
  return v;
}

/// The columns of each term: x [rows, D, C] split along D.
std::vector<at::Tensor> split_terms(const at::Tensor& x, const Irreps& irreps) {
  std::vector<int64_t> dims;
  for (const auto& t : irreps.terms()) dims.push_back(t.irrep.dim());
  return dims.size() == 1 ? std::vector<at::Tensor>{x} : at::split_with_sizes(x, dims, 1);
}

/// x [rows, D, C] @ per-term W [C, C'] / √C, term by term (the scale is
/// applied to the small weight, not to the features).
at::Tensor linear_irreps(const at::Tensor& x, const Irreps& irreps, const std::vector<at::Tensor>& W) {
  const auto parts_in = split_terms(x, irreps);
  std::vector<at::Tensor> parts;
  for (size_t a = 0; a < irreps.size(); ++a) {
    parts.push_back(matmul_bucketed_rows(parts_in[a], W[a] * (1.0 / std::sqrt(static_cast<double>(W[a].size(0))))));
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
}

at::Tensor normal(std::vector<int64_t> shape) { return at::randn(shape, at::kFloat); }

}  // namespace

double average_num_neighbors(int64_t total_edges, int64_t total_atoms) {
  if (total_atoms <= 0) return 1.0;
  return static_cast<double>(total_edges) / static_cast<double>(total_atoms);
}

MaceImpl::MaceImpl(MaceOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (o.max_ell < 1 || o.max_ell > 3) fail("max_ell must be in 1..3, got " + std::to_string(o.max_ell));
  if (o.correlation < 1 || o.correlation > 3) fail("correlation must be in 1..3, got " + std::to_string(o.correlation));
  if (o.num_interactions < 1) fail("num_interactions must be >= 1, got " + std::to_string(o.num_interactions));
  if (o.num_bessel < 1) fail("num_bessel must be >= 1, got " + std::to_string(o.num_bessel));
  if (o.num_polynomial_cutoff < 1) fail("num_polynomial_cutoff must be >= 1, got " + std::to_string(o.num_polynomial_cutoff));
  if (o.readout_mlp < 1) fail("readout_mlp must be >= 1, got " + std::to_string(o.readout_mlp));
  for (int64_t w : o.radial_mlp)
    if (w < 1) fail("radial_mlp widths must be >= 1, got " + std::to_string(w));
  if (!(o.cutoff > 0.0) || !std::isfinite(o.cutoff)) fail("cutoff must be a finite number > 0");
  if (!(o.avg_num_neighbors > 0.0) || !std::isfinite(o.avg_num_neighbors)) fail("avg_num_neighbors must be a finite number > 0");
  if (o.atomic_numbers.empty()) fail("atomic_numbers must list at least one element");
  for (size_t k = 0; k < o.atomic_numbers.size(); ++k) {
    const int64_t z = o.atomic_numbers[k];
    if (z < 1 || z > 118) fail("atomic_numbers must be in 1..118, got " + std::to_string(z));
    if (k > 0 && z <= o.atomic_numbers[k - 1]) fail("atomic_numbers must be ascending without repeats");
  }
  if (o.basis != "crucible" && o.basis != "mace") fail("basis must be crucible or mace, got '" + o.basis + "'");
  if (!(o.silu_normalization >= 0.0) || !std::isfinite(o.silu_normalization)) fail("silu_normalization must be a finite number >= 0");
  Irreps hidden;
  try {
    hidden = Irreps::parse(o.hidden_irreps, 3);
  } catch (const std::exception& e) {
    fail(std::string("hidden_irreps: ") + e.what());
  }
  if (hidden.size() == 0) fail("hidden_irreps must not be empty");
  const int64_t C = hidden.terms()[0].mul;
  std::set<std::string> seen;
  bool has_scalar = false;
  for (const auto& t : hidden.terms()) {
    if (t.mul != C) {
      fail("hidden_irreps '" + o.hidden_irreps + "' must use one multiplicity for every irrep (as MACE), got " +
           std::to_string(t.mul) + " and " + std::to_string(C));
    }
    if (!seen.insert(t.irrep.to_string()).second) fail("hidden_irreps '" + o.hidden_irreps + "' repeats " + t.irrep.to_string());
    if (t.irrep.l > o.max_ell) {
      fail("hidden_irreps '" + o.hidden_irreps + "' has l = " + std::to_string(t.irrep.l) + " above max_ell = " + std::to_string(o.max_ell));
    }
    if (t.irrep.l == 0 && t.irrep.parity == 1) has_scalar = true;
  }
  if (!has_scalar) fail("hidden_irreps '" + o.hidden_irreps + "' must contain scalars (0e)");
  channels_ = C;
  hidden_ = per_channel(irreps_of(hidden));
  if (o.basis == "mace") {
    // One K per layer, output irrep (the last layer: 0e only) and ν.
    bool ok = o.u_columns.size() == static_cast<size_t>(o.num_interactions);
    for (size_t t = 0; ok && t < o.u_columns.size(); ++t) {
      const size_t outs = t + 1 == o.u_columns.size() ? 1 : hidden_.size();
      ok = o.u_columns[t].size() == outs;
      for (const auto& per_nu : o.u_columns[t]) {
        ok = ok && per_nu.size() == static_cast<size_t>(o.correlation);
        for (int64_t k : per_nu) ok = ok && k >= 0;
      }
    }
    if (!ok) fail("u_columns must give, per layer, per output irrep and per correlation order 1.." + std::to_string(o.correlation) + ", a count >= 0");
  }
  reset();
}

void MaceImpl::reset() {
  spline_cache_ = std::make_shared<SplineCache>();  // a clone's weights are its own
  const auto& o = options_;
  const int64_t C = channels_;
  const int64_t nE = static_cast<int64_t>(o.atomic_numbers.size());
  const int64_t T = o.num_interactions;
  z_index_ = at::full({119}, -1, at::kLong);
  u_matrices_.assign(static_cast<size_t>(T), {});
  w3j_.assign(static_cast<size_t>(T), {});
  file_tables_signature_.clear();
  for (int64_t k = 0; k < nE; ++k) z_index_[o.atomic_numbers[static_cast<size_t>(k)]] = k;

  const Irreps target = sh_irreps(o.max_ell);
  const Irreps scalar = per_channel({Irrep{0, 1}});
  layers_.clear();
  radial_.assign(static_cast<size_t>(T), {});
  linear_up_.assign(static_cast<size_t>(T), {});
  linear_.assign(static_cast<size_t>(T), {});
  skip_.assign(static_cast<size_t>(T), {});
  product_linear_.assign(static_cast<size_t>(T), {});
  product_weights_.assign(static_cast<size_t>(T), {});
  readout_.assign(static_cast<size_t>(T), {});

  embedding_ = register_parameter("embedding", normal({nE, C}));
  for (int64_t t = 0; t < T; ++t) {
    const std::string p = "layer" + std::to_string(t) + "_";
    Layer L;
    L.node = t == 0 ? scalar : hidden_;
    L.target = target;
    L.out = t == T - 1 ? scalar : hidden_;
    // basis "mace": these are Crucible's until refresh_file_tables replaces
    // them with the file's (the path list and sizes are the same).
    L.tp = std::make_shared<mace::ConvTensorProduct>(L.node, o.max_ell, L.target);
    const auto outs = irreps_of(L.out);
    if (!mace_basis()) {
      L.table = std::make_shared<mace::MonomialTable>(mace::monomial_table(L.target, outs, o.correlation));
      stack_product_tables(L);
    }
    for (size_t b = 0; b < outs.size(); ++b) {
      int64_t total = 0;
      for (int nu = 1; nu <= o.correlation && !mace_basis(); ++nu) {
        L.bases.push_back(&mace::symmetric_basis(L.target, outs[b], nu));
        total += L.bases.back()->num_basis;
      }
      for (int nu = 1; nu <= o.correlation && mace_basis(); ++nu)
        total += o.u_columns[static_cast<size_t>(t)][b][static_cast<size_t>(nu - 1)];
      if (total == 0) {
        fail("hidden irrep " + outs[b].to_string() + " cannot be built from harmonics to l = " +
             std::to_string(o.max_ell) + " at correlation " + std::to_string(o.correlation));
      }
      if (outs[b] == Irrep{0, 1}) L.out_scalar = b;
    }
    // Interaction.
    for (size_t a = 0; a < L.node.size(); ++a)
      linear_up_[t].push_back(register_parameter(p + "linear_up_" + L.node.terms()[a].irrep.to_string(), normal({C, C})));
    std::vector<int64_t> widths{o.num_bessel};
    for (int64_t w : o.radial_mlp) widths.push_back(w);
    widths.push_back(L.tp->num_paths() * C);
    for (size_t k = 0; k + 1 < widths.size(); ++k)
      radial_[t].push_back(register_parameter(p + "radial_" + std::to_string(k), normal({widths[k], widths[k + 1]})));
    for (size_t b = 0; b < L.target.size(); ++b) {
      int64_t npaths = 0;
      for (const auto& path : L.tp->paths()) npaths += path.target_term == b ? 1 : 0;
      linear_[t].push_back(npaths == 0 ? at::Tensor()
                                       : register_parameter(p + "linear_" + L.target.terms()[b].irrep.to_string(),
                                                            normal({npaths * C, C})));
    }
    if (t == 0) {
      for (size_t b = 0; b < L.target.size(); ++b)
        skip_[t].push_back(register_parameter(p + "skip_" + L.target.terms()[b].irrep.to_string(), normal({nE, C, C})));
    } else {
      // Residual: node term a → the output term with the same irrep.
      for (size_t b = 0; b < L.out.size(); ++b) {
        bool found = false;
        for (size_t a = 0; a < L.node.size(); ++a) found = found || L.node.terms()[a].irrep == L.out.terms()[b].irrep;
        skip_[t].push_back(found ? register_parameter(p + "skip_" + L.out.terms()[b].irrep.to_string(), normal({nE, C, C}))
                                 : at::Tensor());
      }
    }
    // Product basis.
    product_weights_[t].resize(outs.size());
    for (size_t b = 0; b < outs.size(); ++b) {
      for (int nu = 1; nu <= o.correlation; ++nu) {
        const int64_t K = mace_basis() ? o.u_columns[static_cast<size_t>(t)][b][static_cast<size_t>(nu - 1)]
                                       : L.bases[b * static_cast<size_t>(o.correlation) + static_cast<size_t>(nu - 1)]->num_basis;
        product_weights_[t][b].push_back(
            K == 0 ? at::Tensor()
                   : register_parameter(p + "product_" + outs[b].to_string() + "_nu" + std::to_string(nu),
                                        normal({nE, K, C}) / static_cast<double>(K)));
      }
      product_linear_[t].push_back(register_parameter(p + "product_linear_" + outs[b].to_string(), normal({C, C})));
    }
    if (mace_basis()) register_file_tables(L, t, p);
    // Readout.
    if (t < T - 1) {
      readout_[t].push_back(register_parameter(p + "readout", normal({C, 1})));
    } else {
      readout_[t].push_back(register_parameter(p + "readout_mlp_0", normal({C, o.readout_mlp})));
      readout_[t].push_back(register_parameter(p + "readout_mlp_1", normal({o.readout_mlp, 1})));
    }
    layers_.push_back(std::move(L));
  }
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  if (mace_basis()) {
    bessel_weights_ = register_buffer("bessel_weights", at::arange(1, o.num_bessel + 1, opts) * (3.14159265358979323846 / o.cutoff));
    bessel_prefactor_ = register_buffer("bessel_prefactor", at::full({}, std::sqrt(2.0 / o.cutoff), opts));
    cutoff_r_max_ = register_buffer("cutoff_r_max", at::full({}, o.cutoff, opts));
  }
  if (o.pair_repulsion) {  // MACE's defaults; the import copies the file's values
    const ZblParameters zbl = default_zbl_parameters(o.num_polynomial_cutoff);
    zbl_c_ = register_buffer("zbl_c", zbl.c);  // float64, as the energy sums
    zbl_a_exp_ = register_buffer("zbl_a_exp", zbl.a_exp);
    zbl_a_prefactor_ = register_buffer("zbl_a_prefactor", zbl.a_prefactor);
    zbl_covalent_radii_ = register_buffer("zbl_covalent_radii", zbl.covalent_radii);
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);  // energy sums in float64 (issue 48)
  e0_ = register_buffer("e0", at::zeros({119}, f64));
  scale_ = register_buffer("scale", at::ones({}, f64));
  shift_ = register_buffer("shift", at::zeros({}, f64));
}

std::shared_ptr<EnergyModel> MaceImpl::clone_model() const {
  return std::dynamic_pointer_cast<MaceImpl>(clone());
}

at::Tensor MaceImpl::element_index(const at::Tensor& atomic_numbers) const {
  const at::Tensor z = atomic_numbers.to(at::kCPU, at::kLong);
  if (z.numel() > 0 && (z.min().item<int64_t>() < 0 || z.max().item<int64_t>() > 118)) {
    throw std::invalid_argument("MACE: atomic numbers must be in 0..118");
  }
  const at::Tensor idx = z_index_.index_select(0, z);
  if (idx.numel() > 0 && idx.min().item<int64_t>() < 0) {
    const at::Tensor bad = std::get<0>(at::_unique(z.masked_select(idx.lt(0))));
    std::ostringstream os;
    os << "MACE: atomic number(s)";
    for (int64_t k = 0; k < bad.numel(); ++k) os << ' ' << bad[k].item<int64_t>();
    os << " not among the model's elements (";
    for (size_t k = 0; k < options_.atomic_numbers.size(); ++k) os << (k ? " " : "") << options_.atomic_numbers[k];
    os << ")";
    throw std::invalid_argument(os.str());
  }
  return idx.to(atomic_numbers.device());
}

std::vector<at::Tensor> MaceImpl::radial_mlp_weights(int64_t t) const {
  // e3nn FullyConnectedNet: no biases, x W / √fan_in, normalised SiLU c·silu
  // between layers (c and 1/√fan_in folded into the next weight).
  const auto& W = radial_[static_cast<size_t>(t)];
  const double c = silu_factor();
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < W.size(); ++k) {
    out.push_back(W[k] * ((k == 0 ? 1.0 : c) / std::sqrt(static_cast<double>(W[k].size(0)))));
  }
  return out;
}

namespace {

// The MLPs' activation: silu_fused, or at::silu on the reference path.
at::Tensor hidden_silu(const at::Tensor& z, bool ref) { return ref ? at::silu(z) : silu_fused(z); }

// The radial MLP up to its last layer: silu after each hidden product.
at::Tensor radial_hidden(const std::vector<at::Tensor>& W, const at::Tensor& edge_feats, bool ref) {
  at::Tensor h = edge_feats;
  for (size_t k = 0; k + 1 < W.size(); ++k) h = hidden_silu(matmul_bucketed_rows(h, W[k]), ref);
  return h;
}

}  // namespace

at::Tensor MaceImpl::radial_weights(int64_t t, const at::Tensor& edge_feats) const {
  const std::vector<at::Tensor> W = radial_mlp_weights(t);
  return matmul_bucketed_rows(radial_hidden(W, edge_feats, options_.reference_autograd), W.back());
}

std::vector<at::Tensor> MaceImpl::radial_term_weights(int64_t t, const at::Tensor& edge_feats) const {
  const std::vector<at::Tensor> W = radial_mlp_weights(t);
  const at::Tensor h = radial_hidden(W, edge_feats, options_.reference_autograd);
  const mace::ConvTensorProduct& tp = *layers_[static_cast<size_t>(t)].tp;
  std::vector<at::Tensor> out;
  for (size_t a = 0; a < tp.in().size(); ++a) {
    const auto [first, count] = tp.term_path_range(a);
    out.push_back(count == 0 ? at::Tensor()
                             : matmul_bucketed_rows(h, W.back().narrow(1, first * channels_, count * channels_)));
  }
  return out;
}

std::vector<at::Tensor> MaceImpl::product_basis(int64_t t, const at::Tensor& A, const at::Tensor& elem,
                                                bool chunked) const {
  const Layer& L = layers_[static_cast<size_t>(t)];
  const size_t ts = static_cast<size_t>(t);
  std::vector<std::vector<at::Tensor>> wz(L.out.size());
  for (size_t b = 0; b < L.out.size() && !chunked; ++b)
    for (const auto& W : product_weights_[ts][b]) wz[b].push_back(W.defined() ? W.index_select(0, elem) : at::Tensor());
  std::vector<at::Tensor> prod;
  std::vector<int64_t> out_dims;  // each output irrep's dimension, as the engine and checkpointed paths join them
  for (const auto& term : L.out.terms()) out_dims.push_back(term.irrep.dim());
  if (options_.reference_autograd) {
    const size_t corr = static_cast<size_t>(options_.correlation);
    for (size_t b = 0; b < L.out.size(); ++b) {
      std::vector<const mace::SymmetricBasis*> bases(L.bases.begin() + static_cast<long>(b * corr),
                                                     L.bases.begin() + static_cast<long>((b + 1) * corr));
      prod.push_back(mace::symmetric_contraction_reference(A, bases, wz[b]));
    }
  } else if (engine_on(chunked)) {
    // The engine (with the radial splines, issue 48): one fused loop over
    // nodes, forward and reverse (product_basis_engine.h), no monomials
    // stored and no LibTorch op per chunk.
    std::vector<std::vector<at::Tensor>> w(product_weights_[ts].size());
    for (size_t o = 0; o < w.size(); ++o)
      for (const auto& W : product_weights_[ts][o])
        w[o].push_back(W.defined() ? W.detach().to(A.scalar_type()).contiguous() : W);
    const at::Tensor all = mace::product_basis_engine(A, elem.to(at::kLong), w, L.engine_plan);
    prod = at::split_with_sizes(all, out_dims, 1);
  } else {
    std::vector<at::Tensor> stacked, indices;  // in A's dtype and device
    for (const auto& c : L.stacked_coefficients) stacked.push_back(c.defined() ? c.to(A.options()) : c);
    for (const auto& i : L.monomial_indices) indices.push_back(i.to(A.device()));
    // The checkpointed paths give every output irrep side by side, [N, Σ O, C].
    auto joined = [](const std::vector<at::Tensor>& parts) { return parts.size() == 1 ? parts[0] : at::cat(parts, 1); };
    const int64_t rows_chunk = std::max<int64_t>(1, inference_edge_chunk() / 16);
    const Layer* Lp = &L;
    at::Tensor all;
    if (chunked) {
      // Inference path: the monomials ([N, M_ν, C], ~100 KB per atom at
      // ν = 3) exist for one chunk of nodes at a time (issue 19).
      // The element weights of nodes [b, e): [out][ν-1] → [e - b, K, C];
      // with one element present, its row broadcast (no per-node copy).
      const at::Tensor elem_cpu = elem.to(at::kCPU);
      const int64_t only = elem_cpu.numel() > 0 && elem_cpu.min().item<int64_t>() == elem_cpu.max().item<int64_t>()
                               ? elem_cpu[0].item<int64_t>()
                               : -1;
      auto chunk_weights = [weights = product_weights_[ts], elem, only](int64_t b, int64_t e) {
        const at::Tensor el = elem.slice(0, b, e);
        std::vector<std::vector<at::Tensor>> w(weights.size());
        for (size_t o = 0; o < weights.size(); ++o) {
          for (const auto& W : weights[o]) {
            if (!W.defined()) w[o].emplace_back();
            else if (only >= 0) w[o].push_back(W.narrow(0, only, 1).expand({e - b, W.size(1), W.size(2)}));
            else w[o].push_back(W.index_select(0, el));
          }
        }
        return w;
      };
      // The exact reference path: the dense products, differentiated by
      // autograd on each recomputed chunk.
      auto product = [Lp, stacked, indices, chunk_weights, joined](const at::Tensor& A_rows, int64_t b, int64_t e) {
        return joined(mace::symmetric_contraction_fast(A_rows, *Lp->table, stacked, indices, chunk_weights(b, e)));
      };
      all = checkpointed_rows(A, rows_chunk, product);
    } else if (A.size(0) > 16 * inference_edge_chunk()) {
      // Training path at MD scale (more than 16384 nodes by default): the
      // monomials and their first and second derivatives exist for one
      // chunk of 64 nodes at a time, recomputed in the backward passes
      // (issue 19). Measured on 16384 Cu atoms (Zen 5, 1 thread, ν = 3,
      // l ≤ 3, 32 channels): 810 → 558 KB per atom at 1.15× the time
      // (699 → 807 µs per atom), so batches up to 16384 nodes keep the
      // direct product basis.
      std::vector<at::Tensor> xs{A};
      std::vector<size_t> counts;
      for (const auto& per_out : wz) {
        xs.insert(xs.end(), per_out.begin(), per_out.end());
        counts.push_back(per_out.size());
      }
      auto product = [Lp, stacked, indices, counts, joined](const std::vector<at::Tensor>& rows, int64_t, int64_t) {
        std::vector<std::vector<at::Tensor>> w(counts.size());
        size_t k = 1;
        for (size_t o = 0; o < counts.size(); ++o)
          for (size_t j = 0; j < counts[o]; ++j) w[o].push_back(rows[k++]);
        return joined(mace::symmetric_contraction_fast(rows[0], *Lp->table, stacked, indices, w));
      };
      all = checkpointed_rows_twice(xs, rows_chunk, product);
    } else {
      prod = mace::symmetric_contraction_fast(A, *L.table, stacked, indices, wz);
    }
    if (all.defined()) prod = at::split_with_sizes(all, out_dims, 1);
  }
  return prod;
}

at::Tensor MaceImpl::layer_forward(int64_t t, const at::Tensor& h_in, const at::Tensor& elem_all, const at::Tensor& sender,
                                   const at::Tensor& receiver, const at::Tensor& Y, const at::Tensor& radial,
                                   const TermEdges* fast, const PairEdges* chunked, int64_t n_out) {
  const Layer& L = layers_[static_cast<size_t>(t)];
  const size_t ts = static_cast<size_t>(t);
  // Messages come from all h_in.size(0) nodes; everything after the
  // aggregation runs on the first n_out (Batch::layer_nodes).
  const int64_t N = n_out < 0 ? h_in.size(0) : n_out, C = channels_;
  const at::Tensor h = leading_rows(h_in, N);  // the receivers' own features
  const at::Tensor elem = leading_rows(elem_all, N);
  const at::ScalarType layer = h.scalar_type();
  auto keep = [&](const at::Tensor& x) { return x.scalar_type() == layer ? x : x.to(layer); };

  // Residual self-connection (element-dependent), before linear_up (MACE).
  std::vector<at::Tensor> sc(L.out.size());
  if (t > 0) {
    const auto h_terms = split_terms(h, L.node);
    for (size_t b = 0; b < L.out.size(); ++b) {
      if (!skip_[ts][b].defined()) continue;
      for (size_t a = 0; a < L.node.size(); ++a) {
        if (L.node.terms()[a].irrep != L.out.terms()[b].irrep) continue;
        sc[b] = keep(mace::element_linear(h_terms[a], skip_[ts][b], elem));
      }
    }
  }
  const at::Tensor hu = keep(linear_irreps(h_in, L.node, linear_up_[ts]));
  // The inference engine (radial splines, issue 48) merges some linear maps.
  const bool engine = engine_on(chunked);
  at::Tensor agg;  // [N, mid, C]
  if (chunked) {
    // Inference path: `radial` holds the pair features; weights, tables and
    // messages are made chunk by chunk (issue 19).
    // With radial splines (the engine), `radial` holds the pair distances.
    const auto spline = engine ? radial_spline(t) : nullptr;
    // The MLP's weights go in either way: the backward then refuses their
    // gradients (the inference path has none) instead of leaving them zero.
    agg = mace::chunked_aggregate(hu, Y, radial, radial_mlp_weights(t), *L.tp, *chunked, inference_edge_chunk(),
                                  spline.get());
  } else if (fast) {
    std::vector<at::Tensor> w;
    for (const at::Tensor& wa : fast->weights) w.push_back(wa.defined() ? keep(wa).view({wa.size(0), -1, C}) : wa);
    agg = keep(L.tp->aggregate(hu, fast->tables, w, receiver, sender, &fast->pairs));
  } else {
    const at::Tensor w = keep(radial).view({radial.size(0), L.tp->num_paths(), C});
    const at::Tensor m = L.tp->messages_reference(hu.index_select(0, sender), Y, w);
    agg = at::zeros({N, L.tp->mid_dim(), C}, h.options()).index_add(0, receiver, keep(m));
  }
  agg = leading_rows(agg, N);
  // Linear (mid → target) per target irrep, / avg_num_neighbors.
  std::vector<int64_t> path_dims;
  for (const auto& path : L.tp->paths()) path_dims.push_back(path.out.dim());
  const std::vector<at::Tensor> agg_paths = at::split_with_sizes(agg, path_dims, 1);
  const double inv_avg = 1.0 / options_.avg_num_neighbors;
  std::vector<at::Tensor> a_parts;
  for (size_t b = 0; b < L.target.size(); ++b) {
    const int64_t d = L.target.terms()[b].irrep.dim();
    if (!linear_[ts][b].defined()) {
      a_parts.push_back(at::zeros({N, d, C}, h.options()));
      continue;
    }
    std::vector<at::Tensor> cols;
    for (size_t pi = 0; pi < L.tp->paths().size(); ++pi)
      if (L.tp->paths()[pi].target_term == b) cols.push_back(agg_paths[pi]);
    const at::Tensor x = cols.size() == 1 ? cols[0] : at::cat(cols, 2);  // [N, d, P·C]
    const at::Tensor W = linear_[ts][b] * (inv_avg / std::sqrt(static_cast<double>(x.size(2))));
    at::Tensor y;
    if (t == 0 && engine) {  // the linear and the skip merged per element present (issue 48)
      y = mace::element_linear_after(x, W.to(x.scalar_type()), keep(skip_[ts][b]), elem);
    } else {
      y = matmul_bucketed_rows(x, W);
      if (t == 0) y = mace::element_linear(keep(y), skip_[ts][b], elem);
    }
    a_parts.push_back(keep(y));
  }
  const at::Tensor A = at::cat(a_parts, 1);  // [N, D_target, C]

  const std::vector<at::Tensor> prod = product_basis(t, A, elem, chunked);
  std::vector<at::Tensor> out;
  for (size_t b = 0; b < L.out.size(); ++b) {
    at::Tensor y = keep(matmul_bucketed_rows(keep(prod[b]), product_linear_[ts][b] * (1.0 / std::sqrt(static_cast<double>(C)))));
    if (sc[b].defined()) y = y + sc[b];
    out.push_back(y);
  }
  return out.size() == 1 ? out[0] : at::cat(out, 1);
}

at::Tensor MaceImpl::atomic_energies(const Batch& batch) {
  if (mace_basis()) refresh_file_tables();
  const at::ScalarType geom = batch.positions.scalar_type();
  const at::Tensor elem = element_index(batch.atomic_numbers);
  const at::Tensor receiver = batch.edge_index.select(0, 0);
  const at::Tensor sender = batch.edge_index.select(0, 1);
  const bool ref = options_.reference_autograd;
  const at::ScalarType layer = embedding_.scalar_type();
  // Inference path (issue 19): radial MLP, tables and messages per edge chunk.
  const bool chunked = !ref && use_inference_kernels(geom, layer);
  at::Tensor Y, edge_feats, edge_pair, pair_rep, pair;  // pair: ZBL node energies [N] (pair_repulsion)
  // Inference path with radial splines (issue 48): the pair distances stand
  // in for the pair features, and the radial MLP is not evaluated per pair.
  const bool splined = engine_on(chunked);
  at::Tensor pair_r;  // [P, 1] when splined
  std::vector<std::vector<at::Tensor>> tables(layers_.size());
  {
    // Force-safe geometry: autocast off, the positions' dtype.
    AutocastDisabledGuard no_autocast;
    const at::Tensor vec = edge_vectors(batch);  // [E, 3], r_j − r_i
    // [E]; the inference path's backward in one pass (edge_lengths.h).
    at::Tensor r = chunked ? edge_lengths(vec) : vec.pow(2).sum(-1).sqrt();
    if (options_.pair_repulsion) pair = pair_repulsion(batch, r);
    // basis "mace": e3nn's harmonics of r_i − r_j are Crucible's at
    // P(r_i − r_j), P(x, y, z) = (z, x, y) (docs/mace_import.md).
    const at::Tensor sh_vec = mace_basis() ? -vec.index_select(1, at::tensor({2, 0, 1}, at::kLong).to(vec.device())) : vec;
    // The engine's harmonics are one fused loop with a hand-written reverse
    // pass (issue 48); the exact path keeps the reference form.
    Y = splined ? mace::spherical_harmonics_engine(sh_vec, options_.max_ell)
                : mace::spherical_harmonics(sh_vec, options_.max_ell);  // [E, (max_ell+1)²]
    if (!ref) {
      // The radial weights depend on the distance only: once per edge pair.
      std::tie(edge_pair, pair_rep) = reverse_edge_pairs(batch.edge_index, batch.shifts);
      r = r.index_select(0, pair_rep);
      if (splined) pair_r = r.unsqueeze(1);
    }
    if (!splined) {
      const bool file = mace_basis();
      edge_feats = mace::radial_embedding(r, options_.cutoff, options_.num_bessel, options_.num_polynomial_cutoff,
                                          file ? bessel_weights_ : at::Tensor(), file ? bessel_prefactor_ : at::Tensor(),
                                          file ? cutoff_r_max_ : at::Tensor());
    }
    if (!ref && !chunked) {
      // Parameter-free coupling tables, once per distinct layer input.
      for (size_t t = 0; t < layers_.size(); ++t) {
        if (t >= 2) {
          tables[t] = tables[1];
        } else {
          tables[t] = layers_[t].tp->edge_tables(Y);
        }
      }
    }
  }
  for (auto& tt : tables)
    for (auto& x : tt)
      if (x.defined()) x = x.to(layer);
  at::Tensor h = (embedding_ * (1.0 / std::sqrt(static_cast<double>(embedding_.size(0))))).index_select(0, elem).unsqueeze(1);
  const at::Tensor feats = splined ? pair_r.to(layer) : edge_feats.to(layer);
  // Per-layer node sets (Batch::layer_nodes): layer t's receivers are the
  // first extents[t].nodes nodes, its edges the first extents[t].edges.
  const std::vector<LayerExtent> extents = layer_extents(batch, options_.num_interactions);
  const int64_t N = batch.num_nodes();
  LayerPairs pairs;  // inference path: the current layer's pair grouping and features
  PairEdges grouped;          // training fast path: edges of the first `grouped_edges` grouped by pair
  int64_t grouped_edges = -1;
  at::Tensor energy;  // [nodes of the layer], geometry dtype
  for (int64_t t = 0; t < options_.num_interactions; ++t) {
    const int64_t n_out = extents[static_cast<size_t>(t)].nodes, e_t = extents[static_cast<size_t>(t)].edges;
    const at::Tensor recv_t = leading_rows(receiver, e_t), send_t = leading_rows(sender, e_t), Y_t = leading_rows(Y, e_t);
    if (chunked) {  // the radial MLP on this layer's pairs only
      pairs.update(edge_pair, pair_rep.size(0), batch.edge_index, feats, e_t);
      h = layer_forward(t, h, elem, send_t, recv_t, Y_t, pairs.values, nullptr, &pairs.edges, n_out);
    } else {
      if (ref) {
        const at::Tensor radial = leading_rows(radial_weights(t, feats), e_t);
        h = layer_forward(t, h, elem, send_t, recv_t, Y_t, radial, nullptr, nullptr, n_out);
      } else {
        // Per input term: its paths' radial weights, one row per distance
        // pair (the edge contraction reads each edge's pair row), and table.
        // The pair grouping is the previous layer's when its edges are the same.
        if (grouped_edges != e_t) {
          grouped = group_edges_by_pair(leading_rows(edge_pair, e_t), pair_rep.size(0),
                                        batch.edge_index.slice(1, 0, e_t));
          grouped_edges = e_t;
        }
        TermEdges fast;
        fast.pairs = grouped;
        fast.weights = radial_term_weights(t, feats);
        for (const auto& x : tables[static_cast<size_t>(t)]) fast.tables.push_back(x.defined() ? leading_rows(x, e_t) : x);
        h = layer_forward(t, h, elem, send_t, recv_t, Y_t, at::Tensor(), &fast, nullptr, n_out);
      }
    }
    const auto& R = readout_[static_cast<size_t>(t)];
    const auto offs = layers_[static_cast<size_t>(t)].out.offsets();
    const at::Tensor s = h.select(1, offs[layers_[static_cast<size_t>(t)].out_scalar]);  // [N, C]
    at::Tensor e;
    const double inv_c = 1.0 / std::sqrt(static_cast<double>(channels_));
    if (R.size() == 1) {
      e = matmul_bucketed_rows(s, R[0] * inv_c);
    } else {
      const at::Tensor hid = hidden_silu(matmul_bucketed_rows(s, R[0] * inv_c), options_.reference_autograd);
      e = matmul_bucketed_rows(hid, R[1] * (silu_factor() / std::sqrt(static_cast<double>(options_.readout_mlp))));
    }
    AutocastDisabledGuard no_autocast;
    e = e.squeeze(-1).to(geom);
    energy = energy.defined() ? leading_rows(energy, n_out) + e : e;
  }
  AutocastDisabledGuard no_autocast;
  // MACE adds the pair term to the readouts before scale and shift (an
  // imported model keeps that); a model trained here adds the ZBL energy
  // itself after them, as NequIP does. It counts for the nodes whose
  // readouts do (Batch::layer_nodes).
  if (pair.defined()) pair = leading_rows(pair, energy.size(0));
  if (pair.defined() && mace_basis()) energy = energy + pair.to(energy.scalar_type());
  // Scale and shift in float64, as the energy sums (issue 48; an older model
  // file may hold them in float32).
  at::Tensor out = scale_.to(at::kDouble) * pad_nodes(energy, N).to(at::kDouble) + shift_.to(at::kDouble);
  if (pair.defined() && !mace_basis()) out = out + pad_nodes(pair.to(at::kDouble), N);
  return out;
}

at::Tensor MaceImpl::pair_repulsion(const Batch& batch, const at::Tensor& r) const {
  // mace/modules/radial.py ZBLBasis.forward with Crucible's edges (row 0
  // receiver i, row 1 sender j; both directions listed): V_i = ½ Σ_j v(r_ij).
  const ZblParameters zbl{zbl_c_, zbl_a_exp_, zbl_a_prefactor_, zbl_covalent_radii_, options_.num_polynomial_cutoff};
  return zbl_node_energies(r, batch.atomic_numbers, batch.edge_index, batch.num_nodes(), zbl);
}

at::Tensor MaceImpl::node_energies(const Batch& batch) {
  const at::Tensor atomic = atomic_energies(batch);
  AutocastDisabledGuard no_autocast;
  return atomic + e0_.to(at::kDouble).index_select(0, batch.atomic_numbers);
}

at::Tensor MaceImpl::energy(const Batch& batch) {
  const at::Tensor total = node_energies(batch);
  AutocastDisabledGuard no_autocast;
  return at::zeros({batch.num_atoms.size(0)}, total.options()).index_add(0, batch.batch, total);
}

void MaceImpl::set_energy_normalization(const at::Tensor& e0, double scale, double shift) {
  if (!e0.defined() || e0.dim() != 1 || e0.size(0) != 119) {
    throw std::invalid_argument("MACE::set_energy_normalization: e0 must have shape [119]");
  }
  if (!std::isfinite(scale) || !std::isfinite(shift)) {
    throw std::invalid_argument("MACE::set_energy_normalization: scale and shift must be finite");
  }
  at::NoGradGuard no_grad;
  e0_.copy_(e0.detach());
  scale_.fill_(scale);
  shift_.fill_(shift);
}

}  // namespace crucible
