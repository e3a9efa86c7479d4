// Chunked filter network + cfconv for the inference path. See
// include/crucible/models/filter_convolution.h.

#include "crucible/models/filter_convolution.h"
#include "crucible/models/chunk_parallel.h"
#include "crucible/models/shifted_softplus.h"
#include "crucible/models/mace/radial_spline.h"
#include "crucible/neighbors/counting_sort.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace crucible {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

constexpr double kPi = 3.14159265358979323846;

/// The filter of pairs [p0, p1): W [Pc,K], with the intermediates the
/// backward needs (rbf [Pc,G], σ(a1) [Pc,K] = ssp'(a1) of the first layer's
/// output a1, a2 [Pc,K] before f_c).
struct ChunkFilter {
  at::Tensor dc, rbf, sig1, a2, fc, W;
};

ChunkFilter chunk_filter(const at::Tensor& d, int64_t p0, int64_t p1, const at::Tensor& w1, const at::Tensor& b1,
                         const at::Tensor& w2, const at::Tensor& b2, const at::Tensor& offsets, double gamma,
                         double rc, const mace::RadialSpline* spline) {
  ChunkFilter f;
  f.dc = d.slice(0, p0, p1);
  if (spline) {  // the tabulated filter (SchNetImpl::filter_spline): W only
    f.W = spline->values(f.dc);
    return f;
  }
  f.rbf = at::exp(-gamma * (f.dc.unsqueeze(-1) - offsets).pow(2));
  auto [h1, sig1] = shifted_softplus_and_sigmoid(at::addmm(b1, f.rbf, w1.t()));  // one pass over a1
  f.sig1 = sig1;
  f.a2 = at::addmm(b2, h1, w2.t());
  f.fc = 0.5 * (at::cos(f.dc * (kPi / rc)) + 1.0) * (f.dc < rc).to(d.scalar_type());
  f.W = f.a2 * f.fc.unsqueeze(-1);
  return f;
}

// out[recv e] += h[send e] ⊙ W[pair e - p0] over edges order[k0..k1).
template <class T>
void scatter_kernel(const T* __restrict h, const T* __restrict W, const int64_t* order, const int64_t* pair,
                    const int64_t* recv, const int64_t* send, int64_t k0, int64_t k1, int64_t p0, int64_t K,
                    T* __restrict out) {
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t e = order[k];
    const T* __restrict hs = h + send[e] * K;
    const T* __restrict we = W + (pair[e] - p0) * K;
    T* __restrict o = out + recv[e] * K;
#pragma omp simd
    for (int64_t c = 0; c < K; ++c) o[c] += hs[c] * we[c];
  }
}

// gW[pair e - p0] += gv[recv e] ⊙ h[send e];  gh[send e] += gv[recv e] ⊙ W[pair e - p0].
template <class T>
void backward_kernel(const T* __restrict gv, const T* __restrict h, const T* __restrict W, const int64_t* order,
                     const int64_t* pair, const int64_t* recv, const int64_t* send, int64_t k0, int64_t k1,
                     int64_t p0, int64_t K, T* __restrict gW, T* __restrict gh) {
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t e = order[k];
    const T* __restrict g = gv + recv[e] * K;
    const T* __restrict hs = h + send[e] * K;
    const T* __restrict we = W + (pair[e] - p0) * K;
    T* __restrict gw = gW + (pair[e] - p0) * K;
    T* __restrict o = gh + send[e] * K;
#pragma omp simd
    for (int64_t c = 0; c < K; ++c) {
      gw[c] += g[c] * hs[c];
      o[c] += g[c] * we[c];
    }
  }
}

bool cpu_fast(const at::Tensor& h) {
  return h.device().is_cpu() && (h.scalar_type() == at::kFloat || h.scalar_type() == at::kDouble);
}

struct FilterConv : public Function<FilterConv> {
  // Inputs: h, d, w1, b1, w2, b2 (differentiable), offsets, then the edge
  // grouping (edge_pair, order, offsets, receiver, sender).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& d, const at::Tensor& w1,
                            const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                            const at::Tensor& mu, const at::Tensor& edge_pair, const at::Tensor& order,
                            const at::Tensor& pair_offsets, const at::Tensor& receiver, const at::Tensor& sender,
                            double gamma, double rc, int64_t chunk, const mace::RadialSpline* spline) {
    ctx->save_for_backward({h, d, w1, b1, w2, b2, mu, edge_pair, order, pair_offsets, receiver, sender});
    ctx->saved_data["spline"] = reinterpret_cast<int64_t>(spline);
    ctx->saved_data["gamma"] = gamma;
    ctx->saved_data["rc"] = rc;
    ctx->saved_data["chunk"] = chunk;
    const int64_t P = d.size(0), K = h.size(1);
    const int64_t* off = pair_offsets.data_ptr<int64_t>();
    const int64_t num_chunks = (P + chunk - 1) / chunk;
    const at::Tensor hc = h.contiguous();
    return sum_over_chunks(num_chunks, {hc}, [&](int64_t c, std::vector<at::Tensor>& accs) {
      at::Tensor& acc = accs[0];
      const int64_t p0 = c * chunk, p1 = std::min(P, p0 + chunk);
      const ChunkFilter f = chunk_filter(d, p0, p1, w1, b1, w2, b2, mu, gamma, rc, spline);
      if (cpu_fast(hc)) {
        const at::Tensor W = f.W.contiguous();
        AT_DISPATCH_FLOATING_TYPES(hc.scalar_type(), "filter_convolution", [&] {
          scatter_kernel<scalar_t>(hc.data_ptr<scalar_t>(), W.data_ptr<scalar_t>(), order.data_ptr<int64_t>(),
                                   edge_pair.data_ptr<int64_t>(), receiver.data_ptr<int64_t>(),
                                   sender.data_ptr<int64_t>(), off[p0], off[p1], p0, K, acc.data_ptr<scalar_t>());
        });
      } else {
        const at::Tensor ec = order.slice(0, off[p0], off[p1]);
        const at::Tensor local = edge_pair.index_select(0, ec) - p0;
        acc.index_add_(0, receiver.index_select(0, ec),
                       hc.index_select(0, sender.index_select(0, ec)) * f.W.index_select(0, local));
      }
    })[0];
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error(
          "SchNet inference path: no differentiable backward (create_graph); use ComputeOptions::training");
    }
    for (size_t k = 2; k < 6; ++k) {
      if (ctx->needs_input_grad(k)) {
        throw std::runtime_error(
            "SchNet inference path: no parameter gradients; use ComputeOptions::training for a force loss");
      }
    }
    const auto s = ctx->get_saved_variables();
    const at::Tensor &h = s[0], &d = s[1], &w1 = s[2], &b1 = s[3], &w2 = s[4], &b2 = s[5], &mu = s[6];
    const at::Tensor &edge_pair = s[7], &order = s[8], &pair_offsets = s[9], &receiver = s[10], &sender = s[11];
    const double gamma = ctx->saved_data["gamma"].toDouble();
    const double rc = ctx->saved_data["rc"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto* spline = reinterpret_cast<const mace::RadialSpline*>(ctx->saved_data["spline"].toInt());
    const at::Tensor gv = grads[0].contiguous();
    const at::Tensor hc = h.contiguous();
    const int64_t P = d.size(0), K = h.size(1);
    const int64_t* off = pair_offsets.data_ptr<int64_t>();
    const int64_t num_chunks = (P + chunk - 1) / chunk;
    at::Tensor gd = at::zeros_like(d);
    at::Tensor gh = sum_over_chunks(num_chunks, {hc}, [&](int64_t c, std::vector<at::Tensor>& accs) {
      at::Tensor& acc = accs[0];
      const int64_t p0 = c * chunk, p1 = std::min(P, p0 + chunk);
      const ChunkFilter f = chunk_filter(d, p0, p1, w1, b1, w2, b2, mu, gamma, rc, spline);
      at::Tensor gW = at::zeros_like(f.W);
      if (cpu_fast(hc)) {
        const at::Tensor W = f.W.contiguous();
        AT_DISPATCH_FLOATING_TYPES(hc.scalar_type(), "filter_convolution_backward", [&] {
          backward_kernel<scalar_t>(gv.data_ptr<scalar_t>(), hc.data_ptr<scalar_t>(), W.data_ptr<scalar_t>(),
                                    order.data_ptr<int64_t>(), edge_pair.data_ptr<int64_t>(),
                                    receiver.data_ptr<int64_t>(), sender.data_ptr<int64_t>(), off[p0], off[p1], p0,
                                    K, gW.data_ptr<scalar_t>(), acc.data_ptr<scalar_t>());
        });
      } else {
        const at::Tensor ec = order.slice(0, off[p0], off[p1]);
        const at::Tensor local = edge_pair.index_select(0, ec) - p0;
        const at::Tensor g = gv.index_select(0, receiver.index_select(0, ec));
        const at::Tensor snd = sender.index_select(0, ec);
        gW.index_add_(0, local, g * hc.index_select(0, snd));
        acc.index_add_(0, snd, g * f.W.index_select(0, local));
      }
      if (spline) {  // ∂/∂d = Σ_k ∂/∂W_k · W_k'(d)
        gd.slice(0, p0, p1).copy_(spline->backward(f.dc, gW));
        return;
      }
      // Back through W = a2 · f_c, a2 = ssp(a1) W2ᵀ + b2, a1 = g(d) W1ᵀ + b1.
      const at::Tensor g_a2 = gW * f.fc.unsqueeze(-1);
      const at::Tensor g_fc = (gW * f.a2).sum(-1);
      const at::Tensor g_a1 = g_a2.mm(w2) * f.sig1;
      const at::Tensor g_rbf = g_a1.mm(w1);  // [Pc,G]
      const at::Tensor dmu = f.dc.unsqueeze(-1) - mu;
      at::Tensor g_d = (g_rbf * f.rbf * (-2.0 * gamma) * dmu).sum(-1);
      g_d = g_d + g_fc * (-0.5 * kPi / rc) * at::sin(f.dc * (kPi / rc)) * (f.dc < rc).to(d.scalar_type());
      gd.slice(0, p0, p1).copy_(g_d);
    })[0];
    at::Tensor gh_out = ctx->needs_input_grad(0) ? gh : at::Tensor();
    at::Tensor gd_out = ctx->needs_input_grad(1) ? gd : at::Tensor();
    return {gh_out, gd_out, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

PairEdges group_edges_by_pair(const at::Tensor& edge_pair, int64_t num_pairs, const at::Tensor& edge_index) {
  TORCH_CHECK(edge_pair.dim() == 1 && edge_index.dim() == 2 && edge_index.size(0) == 2 &&
                  edge_index.size(1) == edge_pair.size(0),
              "group_edges_by_pair: edge_pair [E] and edge_index [2,E] expected");
  TORCH_CHECK(num_pairs >= 0, "group_edges_by_pair: num_pairs must be >= 0");
  const at::Tensor ep = edge_pair.to(at::kCPU, at::kLong).contiguous();
  const int64_t E = ep.size(0);
  const int64_t* p = ep.data_ptr<int64_t>();
  at::Tensor offsets = at::empty({num_pairs + 2}, at::kLong);
  at::Tensor order = at::empty({E}, at::kLong);
  int64_t kept = 0;
  try {
    kept = counting_sort(p, E, num_pairs, offsets.data_ptr<int64_t>(), order.data_ptr<int64_t>());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "group_edges_by_pair: pair index out of range (", e.what(), ")");
  }
  TORCH_CHECK(kept == E, "group_edges_by_pair: pair index out of range (a negative pair index)");
  offsets = offsets.narrow(0, 0, num_pairs + 1);
  const auto dev = edge_index.device();
  PairEdges g;
  g.edge_pair = ep.to(dev);
  g.order = order.to(dev);
  g.offsets = offsets;
  g.receiver = edge_index.select(0, 0).to(at::kLong).contiguous();
  g.sender = edge_index.select(0, 1).to(at::kLong).contiguous();
  return g;
}

at::Tensor filter_convolution(const at::Tensor& h, const at::Tensor& d, const FilterNetwork& net,
                              const PairEdges& edges, int64_t chunk, const mace::RadialSpline* spline) {
  TORCH_CHECK(h.dim() == 2 && d.dim() == 1 && net.w1.dim() == 2 && net.w2.dim() == 2 &&
                  net.w1.size(0) == h.size(1) && net.w2.size(0) == h.size(1) && net.w2.size(1) == h.size(1) &&
                  net.offsets.numel() == net.w1.size(1) && edges.offsets.numel() == d.size(0) + 1,
              "filter_convolution: h [N,K], d [P], w1 [K,G], w2 [K,K], offsets [G], pair offsets [P+1] expected");
  TORCH_CHECK(h.scalar_type() == d.scalar_type() && h.scalar_type() == net.w1.scalar_type() &&
                  h.scalar_type() == net.w2.scalar_type(),
              "filter_convolution: h, d and the filter network must share one dtype");
  TORCH_CHECK(chunk >= 1, "filter_convolution: chunk must be >= 1");
  TORCH_CHECK(!spline || (spline->num_outputs() == h.size(1) && spline->dtype() == h.scalar_type() &&
                          h.device().is_cpu()),
              "filter_convolution: the spline must have h's K outputs and dtype, on the CPU");
  return FilterConv::apply(h, d, net.w1, net.b1, net.w2, net.b2, net.offsets.to(d.scalar_type()), edges.edge_pair,
                           edges.order, edges.offsets, edges.receiver, edges.sender, net.gamma, net.cutoff, chunk,
                           spline);
}

}  // namespace crucible
