// SchNet (Schütt, Sauceda, Kindermans, Tkatchenko, Müller, J. Chem. Phys.
// 148, 241722 (2018)), in the layer layout of schnetpack's SchNetInteraction:
// in2f (no bias) → continuous-filter convolution → f2out (Dense + ssp) → Dense,
// with a residual update of the atom features.

#include "crucible/models/schnet.h"
#include "crucible/models/zbl.h"
#include "crucible/models/layer_nodes.h"
#include "crucible/models/cfconv.h"
#include "crucible/models/edge_lengths.h"
#include "crucible/models/filter_convolution.h"
#include "crucible/models/row_scale.h"
#include "crucible/models/gemm_rows.h"
#include "crucible/models/shifted_softplus.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>
#include <stdexcept>
#include <string>

namespace crucible {
namespace {

constexpr double kPi = 3.14159265358979323846;

/// The activation: hand-written derivatives, or autograd's (reference path).
at::Tensor ssp(const at::Tensor& x, bool reference) {
  return reference ? shifted_softplus_reference(x) : shifted_softplus(x);
}

void check_options(const SchNetOptions& o) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("SchNetOptions: " + what);
  };
  if (o.hidden_channels < 2) fail("hidden_channels must be >= 2, got " + std::to_string(o.hidden_channels));
  if (o.num_filters < 1) fail("num_filters must be >= 1, got " + std::to_string(o.num_filters));
  if (o.num_interactions < 0) fail("num_interactions must be >= 0, got " + std::to_string(o.num_interactions));
  if (o.num_gaussians < 2) fail("num_gaussians must be >= 2, got " + std::to_string(o.num_gaussians));
  if (!(o.cutoff > 0.0) || !std::isfinite(o.cutoff)) fail("cutoff must be a finite number > 0, got " + std::to_string(o.cutoff));
  if (o.max_atomic_number < 1) fail("max_atomic_number must be >= 1, got " + std::to_string(o.max_atomic_number));
}

}  // namespace

SchNetImpl::SchNetImpl(SchNetOptions options) : options_(options) {
  check_options(options_);
  reset();
}

void SchNetImpl::reset() {
  spline_cache_ = std::make_shared<SplineCache>();  // a clone's weights are its own
  const int64_t F = options_.hidden_channels;
  const int64_t K = options_.num_filters;
  const int64_t G = options_.num_gaussians;
  const int64_t T = options_.num_interactions;

  embedding_ = register_module("embedding", torch::nn::Embedding(options_.max_atomic_number + 1, F));
  filter1_ = register_module("filter1", torch::nn::ModuleList());
  filter2_ = register_module("filter2", torch::nn::ModuleList());
  in2f_ = register_module("in2f", torch::nn::ModuleList());
  f2out_ = register_module("f2out", torch::nn::ModuleList());
  dense_ = register_module("dense", torch::nn::ModuleList());
  for (int64_t t = 0; t < T; ++t) {
    filter1_->push_back(torch::nn::Linear(G, K));
    filter2_->push_back(torch::nn::Linear(K, K));
    in2f_->push_back(torch::nn::Linear(torch::nn::LinearOptions(F, K).bias(false)));
    f2out_->push_back(torch::nn::Linear(K, F));
    dense_->push_back(torch::nn::Linear(F, F));
  }
  out1_ = register_module("out1", torch::nn::Linear(F, F / 2));
  out2_ = register_module("out2", torch::nn::Linear(F / 2, 1));

  const auto opts = at::TensorOptions().dtype(at::kFloat);
  offsets_ = register_buffer("offsets", at::linspace(0.0, options_.cutoff, G, opts));
  const auto f64 = at::TensorOptions().dtype(at::kDouble);  // energy sums in float64 (issue 48)
  e0_ = register_buffer("e0", at::zeros({options_.max_atomic_number + 1}, f64));
  scale_ = register_buffer("scale", at::ones({}, f64));
  shift_ = register_buffer("shift", at::zeros({}, f64));
  if (options_.pair_repulsion) {  // MACE's ZBL constants (models/zbl.h)
    const ZblParameters zbl = default_zbl_parameters(kZblEnvelopeP);
    zbl_c_ = register_buffer("zbl_c", zbl.c);  // float64, as the energy sums
    zbl_a_exp_ = register_buffer("zbl_a_exp", zbl.a_exp);
    zbl_a_prefactor_ = register_buffer("zbl_a_prefactor", zbl.a_prefactor);
    zbl_covalent_radii_ = register_buffer("zbl_covalent_radii", zbl.covalent_radii);
  }
}

at::Tensor SchNetImpl::atomic_energies(const Batch& batch) {
  const int64_t N = batch.positions.size(0);
  const double rc = options_.cutoff;
  const double delta = rc / static_cast<double>(options_.num_gaussians - 1);
  const double gamma = 0.5 / (delta * delta);
  // Geometry dtype: the positions' (float32 / float64). Layer dtype: the
  // parameters' (lower only under the *-true half modes).
  const at::ScalarType geom = batch.positions.scalar_type();
  const at::ScalarType layer = out2_->weight.scalar_type();

  const bool ref = options_.reference_autograd;
  // Inference path (issue 19): the filter network and cfconv fused over
  // edge chunks, no per-edge tensor kept for the backward.
  const bool chunked = !ref && use_inference_kernels(geom, layer);
  const at::Tensor i = batch.edge_index.select(0, 0);
  const at::Tensor j = batch.edge_index.select(0, 1);
  at::Tensor rbf, fc;
  at::Tensor edge_pair, pair_rep;  // fast path: [E] pair of each edge, [P] one edge per pair
  at::Tensor pair_d;               // [P] pair distances (fast and inference paths)
  at::Tensor pair;                 // [N] ZBL energies (SchNetOptions::pair_repulsion)
  // bf16 products on the CPU: the filter network's rows (pairs) are padded
  // once to a row bucket (gemm_rows.h), with distance r_c so f_c = 0.
  const bool pad_pairs = !ref && !chunked && cpu_bf16_gemm(batch.positions, out2_->weight);
  {
    // Force-safe geometry (issue 3, deliverable 4): autocast off, so edge
    // vectors, distances, the Gaussian basis and the cutoff keep `geom`.
    AutocastDisabledGuard no_autocast;
    const at::Tensor vec = edge_vectors(batch);                  // [E,3]
    // [E]; the inference path's backward in one pass (edge_lengths.h).
    at::Tensor d = chunked ? edge_lengths(vec) : vec.pow(2).sum(-1).sqrt();
    if (options_.pair_repulsion) {  // ZBL per node from every edge (issue 48)
      const ZblParameters zbl{zbl_c_, zbl_a_exp_, zbl_a_prefactor_, zbl_covalent_radii_, kZblEnvelopeP};
      pair = zbl_node_energies(d, batch.atomic_numbers, batch.edge_index, N, zbl);
    }
    if (!ref) {
      // Fast path: the filter depends on the distance only, which an edge
      // shares with its reverse; compute it once per pair (P ≈ E/2 rows).
      std::tie(edge_pair, pair_rep) = reverse_edge_pairs(batch.edge_index, batch.shifts);
      d = d.index_select(0, pair_rep);                           // [P]
      const int64_t P = d.size(0), padded = gemm_row_bucket(P);
      if (pad_pairs && padded > P) d = at::constant_pad_nd(d, {0, padded - P}, rc);  // rows no edge reads
    }
    pair_d = d;
    if (!chunked) {  // the inference path expands d chunk by chunk
      // Gaussian expansion g_k(d) = exp(-γ (d - μ_k)²): [E,G].
      rbf = at::exp(-gamma * (d.unsqueeze(-1) - offsets_.to(geom)).pow(2));
      // Cosine cutoff f_c(d) = ½(cos(πd/r_c) + 1) for d < r_c, else 0 (Behler 2011): [E].
      fc = 0.5 * (at::cos(d * (kPi / rc)) + 1.0) * (d < rc).to(geom);
    }
  }
  // Inner layers run in the layer dtype, or autocast's inside a mixed region.
  const at::Tensor rbf_in = chunked ? at::Tensor() : rbf.to(layer);
  // Per-layer node sets (Batch::layer_nodes): layer t's receivers are the
  // first extents[t].nodes nodes, its edges the first extents[t].edges.
  const std::vector<LayerExtent> extents = layer_extents(batch, options_.num_interactions);
  LayerPairs pairs;  // inference path: the current layer's pair grouping and distances

  // Dense layers: rows padded to a bucket when the product runs in bf16 on
  // the CPU (gemm_rows.h: oneDNN builds a kernel per new row count).
  const auto linear = [ref](auto& layer, const at::Tensor& in) {
    return ref ? layer->forward(in) : linear_bucketed_rows(in, layer->weight, layer->bias);
  };
  at::Tensor x = embedding_->forward(batch.atomic_numbers);   // [N,F]
  for (int64_t t = 0; t < options_.num_interactions; ++t) {
    const int64_t n_out = extents[static_cast<size_t>(t)].nodes, e_t = extents[static_cast<size_t>(t)].edges;
    const at::Tensor i_t = leading_rows(i, e_t), j_t = leading_rows(j, e_t);
    // The filter network on this layer's pairs only.
    if (chunked) pairs.update(edge_pair, pair_rep.size(0), batch.edge_index, pair_d, e_t);
    auto filter1 = filter1_->ptr<torch::nn::LinearImpl>(t);
    auto filter2 = filter2_->ptr<torch::nn::LinearImpl>(t);
    auto in2f = in2f_->ptr<torch::nn::LinearImpl>(t);
    auto f2out = f2out_->ptr<torch::nn::LinearImpl>(t);
    auto dense = dense_->ptr<torch::nn::LinearImpl>(t);
    const at::Tensor h = linear(in2f, x);                     // [N,K]
    at::Tensor v;                                             // Σ_j h_j ⊙ W_ij, [N,K]
    if (chunked) {  // filter network + cfconv per pair chunk (issue 19)
      const FilterNetwork net{filter1->weight, filter1->bias, filter2->weight, filter2->bias,
                              offsets_.to(geom), gamma, rc};
      // The filter tabulated once per set of weights (issue 48), on the CPU.
      const auto spline = h.device().is_cpu() ? filter_spline(t) : nullptr;
      v = filter_convolution(h, pairs.values, net, pairs.edges, inference_edge_chunk(), spline.get());
    } else {
      // Filter-generating network W(r_ij) = Dense(ssp(Dense(g(r_ij)))) · f_c: [E,K].
      // The cutoff in the filter's dtype (bf16 under bf16 autocast), so the
      // filter reaches cfconv_pairs without a cast to float32 and back.
      const at::Tensor a2 = linear(filter2, ssp(linear(filter1, rbf_in), ref));
      // The fast path scales the rows in one fused pass (row_scale.h), whose
      // derivatives need no [P,K] products summed afterwards.
      at::Tensor W = ref ? a2 * fc.unsqueeze(-1).to(layer) : scale_rows(a2, fc.to(a2.scalar_type()));
      if (ref) {
        const at::Tensor msg = h.index_select(0, j_t) * leading_rows(W, e_t);  // [E,K]
        v = at::zeros({h.size(0), msg.size(1)}, msg.options()).index_add(0, i_t, msg);
      } else {
        // Fused, hand-written derivatives (issue 7); W stays per pair [P,K].
        v = cfconv_pairs(h, W, i_t, j_t, leading_rows(edge_pair, e_t));
      }
    }
    v = linear(dense, ssp(linear(f2out, leading_rows(v, n_out)), ref));  // [n_out,F]
    x = leading_rows(x, n_out) + v.to(x.scalar_type());
  }
  at::Tensor y = linear(out2_, ssp(linear(out1_, x), ref)).squeeze(-1);  // [N]
  // Scale and shift in float64, as the energy sums (issue 48); an older
  // model file may hold them in float32.
  AutocastDisabledGuard no_autocast;
  y = pad_nodes(y.to(at::kDouble), N);
  at::Tensor out = scale_.to(at::kDouble) * y + shift_.to(at::kDouble);
  if (pair.defined()) out = out + pair.to(at::kDouble);  // the physical ZBL energy, unscaled
  return out;
}

std::shared_ptr<EnergyModel> SchNetImpl::clone_model() const {
  return std::dynamic_pointer_cast<SchNetImpl>(clone());
}

at::Tensor SchNetImpl::node_energies(const Batch& batch) {
  const at::Tensor atomic = atomic_energies(batch);  // [N] float64
  AutocastDisabledGuard no_autocast;
  return atomic + e0_.to(at::kDouble).index_select(0, batch.atomic_numbers);
}

at::Tensor SchNetImpl::energy(const Batch& batch) {
  // The per-atom → per-structure sum runs with autocast off in float64.
  const at::Tensor total = node_energies(batch);  // [N]
  AutocastDisabledGuard no_autocast;
  const int64_t B = batch.num_atoms.size(0);
  return at::zeros({B}, total.options()).index_add(0, batch.batch, total);
}

void SchNetImpl::set_energy_normalization(const at::Tensor& e0, double scale, double shift) {
  if (!e0.defined() || e0.dim() != 1 || e0.size(0) != options_.max_atomic_number + 1) {
    throw std::invalid_argument("SchNet::set_energy_normalization: e0 must have shape [" +
                                std::to_string(options_.max_atomic_number + 1) + "]");
  }
  if (!std::isfinite(scale) || !std::isfinite(shift)) {
    throw std::invalid_argument("SchNet::set_energy_normalization: scale and shift must be finite");
  }
  at::NoGradGuard no_grad;
  e0_.copy_(e0.detach());
  scale_.fill_(scale);
  shift_.fill_(shift);
}

std::vector<int64_t> SchNetImpl::elements() const {
  const at::Tensor nz = e0_.detach().to(at::kCPU).ne(0).nonzero().flatten().to(at::kLong).contiguous();
  return std::vector<int64_t>(nz.data_ptr<int64_t>(), nz.data_ptr<int64_t>() + nz.numel());
}

}  // namespace crucible
