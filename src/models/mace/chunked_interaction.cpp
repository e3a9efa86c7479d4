// Chunked MACE interaction for the inference path. See
// include/crucible/models/mace/chunked_interaction.h.

#include "crucible/models/mace/chunked_interaction.h"

#include "crucible/models/chunk_parallel.h"
#include "crucible/models/silu.h"
#include "crucible/models/mace/edge_contraction.h"
#include "crucible/models/mace/sparse_coupling.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <vector>

namespace crucible::mace {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

/// What the forward and the backward share: the layer's static data.
struct Layout {
  std::vector<int64_t> terms;              // input terms with paths
  std::vector<at::Tensor> coupling;        // per listed term, without a spline: M [Dsh, rows·d1], x's dtype
  std::vector<const SparseCoupling*> sparse;  // per listed term, with a spline (the engine): M by column
  std::vector<at::Tensor> row_path;        // per listed term: [rows] int64
  std::vector<int64_t> term_offset, term_dim;  // per listed term: rows of x
};

Layout make_layout(const ConvTensorProduct& tp, const at::Tensor& like, bool engine) {
  Layout L;
  const auto offsets = tp.in().offsets();
  for (size_t a = 0; a < tp.in().size(); ++a) {
    if (!tp.term_coupling(a).defined()) continue;
    L.terms.push_back(static_cast<int64_t>(a));
    if (engine) {
      L.sparse.push_back(tp.term_sparse_coupling(a));
    } else {
      L.coupling.push_back(tp.term_coupling(a).to(like.options()));
    }
    L.row_path.push_back(tp.term_row_path(a).to(like.device()).contiguous());
    L.term_offset.push_back(offsets[a]);
    L.term_dim.push_back(tp.in().terms()[a].irrep.dim());
  }
  return L;
}

/// The edges' pair, receiver and sender in pair order (`order`), gathered
/// once per pass: a chunk's are then slices (no three gathers per chunk).
struct InOrder {
  at::Tensor pair, receiver, sender;  // [E] int64, contiguous
};

InOrder in_order(const at::Tensor& order, const at::Tensor& edge_pair, const at::Tensor& receiver,
                 const at::Tensor& sender) {
  return {edge_pair.index_select(0, order), receiver.index_select(0, order), sender.index_select(0, order)};
}

/// One chunk's edges and recomputed per-edge tensors.
struct Chunk {
  at::Tensor edges, local, recv, send;  // [Ec]
  std::vector<at::Tensor> z;            // MLP pre-activations [Pc, width] (all but the last layer)
  at::Tensor w;                         // [Pc, P_paths, C], contiguous: one row per pair, edge e's is local[e]
  at::Tensor Y;                         // [Ec, Dsh] (not with a spline: the engine reads Y's rows in place)
  std::vector<at::Tensor> T;            // per listed term: [Ec, rows, d1], contiguous
};

Chunk make_chunk(int64_t p0, int64_t p1, const at::Tensor& feats, const at::Tensor& Y,
                 const std::vector<at::Tensor>& mlp, const RadialSpline* spline, const Layout& L,
                 const at::Tensor& order, const int64_t* off, const InOrder& edges_in_order, int64_t num_paths,
                 int64_t C) {
  Chunk k;
  k.edges = order.slice(0, off[p0], off[p1]);
  k.local = edges_in_order.pair.slice(0, off[p0], off[p1]) - p0;
  k.recv = edges_in_order.receiver.slice(0, off[p0], off[p1]);
  k.send = edges_in_order.sender.slice(0, off[p0], off[p1]);
  at::Tensor h = feats.slice(0, p0, p1);
  if (spline) h = spline->values(h.select(1, 0));  // feats holds the distances [P,1]
  for (size_t m = 0; m < (spline ? 0 : mlp.size()); ++m) {
    at::Tensor zm = at::mm(h, mlp[m]);
    if (m + 1 < mlp.size()) {
      k.z.push_back(zm);
      h = silu_fused(zm);
    } else {
      h = zm;
    }
  }
  const int64_t Ec = k.edges.size(0);
  k.w = h.view({p1 - p0, num_paths, C}).contiguous();
  if (spline) {  // the engine: the tables straight from Y's rows (Y contiguous, CPU)
    for (size_t t = 0; t < L.terms.size(); ++t) {
      at::Tensor T = at::empty({Ec, L.row_path[t].size(0), L.term_dim[t]}, Y.options());
      at::Tensor flat = T.view({Ec, -1});
      L.sparse[t]->tables(Y, k.edges, flat);
      k.T.push_back(T);
    }
    return k;
  }
  k.Y = Y.index_select(0, k.edges);
  for (size_t t = 0; t < L.terms.size(); ++t) {
    k.T.push_back(at::mm(k.Y, L.coupling[t]).view({Ec, -1, L.term_dim[t]}).contiguous());
  }
  return k;
}

struct ChunkedAggregate : public Function<ChunkedAggregate> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& Y, const at::Tensor& feats,
                            at::TensorList mlp, const at::Tensor& edge_pair, const at::Tensor& order,
                            const at::Tensor& pair_offsets, const at::Tensor& receiver, const at::Tensor& sender,
                            const ConvTensorProduct* tp, const RadialSpline* spline, int64_t chunk) {
    std::vector<at::Tensor> saved{x, Y, feats, edge_pair, order, pair_offsets, receiver, sender};
    saved.insert(saved.end(), mlp.begin(), mlp.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    ctx->saved_data["spline"] = reinterpret_cast<int64_t>(spline);
    ctx->saved_data["chunk"] = chunk;
    const std::vector<at::Tensor> w(mlp.begin(), mlp.end());
    return run_forward(x, Y, feats, w, spline, edge_pair, order, pair_offsets, receiver, sender, *tp, chunk);
  }

  static at::Tensor run_forward(const at::Tensor& x, const at::Tensor& Y, const at::Tensor& feats,
                                const std::vector<at::Tensor>& mlp, const RadialSpline* spline,
                                const at::Tensor& edge_pair,
                                const at::Tensor& order, const at::Tensor& pair_offsets, const at::Tensor& receiver,
                                const at::Tensor& sender, const ConvTensorProduct& tp, int64_t chunk) {
    const Layout L = make_layout(tp, x, spline != nullptr);
    const int64_t N = x.size(0), C = x.size(2), P = feats.size(0), NP = tp.num_paths();
    std::vector<at::Tensor> xs, like;
    for (size_t t = 0; t < L.terms.size(); ++t) {
      xs.push_back(x.narrow(1, L.term_offset[t], L.term_dim[t]).contiguous());
      like.push_back(at::empty({N, L.row_path[t].size(0), C}, x.options()));
    }
    const int64_t* off = pair_offsets.data_ptr<int64_t>();
    const InOrder ordered = in_order(order, edge_pair, receiver, sender);
    const int64_t num_chunks = (P + chunk - 1) / chunk;
    std::vector<at::Tensor> agg = sum_over_chunks(num_chunks, like, [&](int64_t c, std::vector<at::Tensor>& acc) {
      const int64_t p0 = c * chunk, p1 = std::min(P, p0 + chunk);
      if (off[p0] == off[p1]) return;  // pairs without edges (none after compact_pairs)
      const Chunk k = make_chunk(p0, p1, feats, Y, mlp, spline, L, order, off, ordered, NP, C);
      for (size_t t = 0; t < L.terms.size(); ++t) {
        edge_contraction_accumulate(EdgeSlot::kMessage, acc[t], at::Tensor(), k.w, k.T[t], xs[t], k.recv, k.send,
                                    L.row_path[t], k.local);
      }
    });
    return agg.size() == 1 ? agg[0] : at::cat(agg, 1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error(
          "MACE inference path: no differentiable backward (create_graph); use ComputeOptions::training");
    }
    const auto s = ctx->get_saved_variables();
    const size_t num_mlp = s.size() - 8;
    for (size_t m = 0; m < num_mlp; ++m) {
      if (ctx->needs_input_grad(3 + m)) {
        throw std::runtime_error(
            "MACE inference path: no parameter gradients; use ComputeOptions::training for a force loss");
      }
    }
    const at::Tensor &x = s[0], &Y = s[1], &feats = s[2], &edge_pair = s[3], &order = s[4], &pair_offsets = s[5];
    const at::Tensor &receiver = s[6], &sender = s[7];
    const std::vector<at::Tensor> mlp(s.begin() + 8, s.end());
    const auto* tp = reinterpret_cast<const ConvTensorProduct*>(ctx->saved_data["tp"].toInt());
    const auto* spline = reinterpret_cast<const RadialSpline*>(ctx->saved_data["spline"].toInt());
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const Layout L = make_layout(*tp, x, spline != nullptr);
    const int64_t C = x.size(2), P = feats.size(0), NP = tp->num_paths();
    const at::Tensor gA = grads[0];
    std::vector<at::Tensor> xs, gs;
    int64_t row = 0;
    for (size_t t = 0; t < L.terms.size(); ++t) {
      xs.push_back(x.narrow(1, L.term_offset[t], L.term_dim[t]).contiguous());
      const int64_t rows = L.row_path[t].size(0);
      gs.push_back(gA.narrow(1, row, rows).contiguous());
      row += rows;
    }
    at::Tensor gY = at::zeros_like(Y);
    at::Tensor gfeats = at::zeros_like(feats);
    const int64_t* off = pair_offsets.data_ptr<int64_t>();
    const InOrder ordered = in_order(order, edge_pair, receiver, sender);
    const int64_t num_chunks = (P + chunk - 1) / chunk;
    // No ∂/∂x where x is a constant (the first layer's embedding when the
    // weights are held fixed): a third of that layer's backward loop.
    const bool need_gx = ctx->needs_input_grad(0);
    std::vector<at::Tensor> gx = sum_over_chunks(num_chunks, need_gx ? xs : std::vector<at::Tensor>{},
                                                 [&](int64_t c, std::vector<at::Tensor>& acc) {
      const int64_t p0 = c * chunk, p1 = std::min(P, p0 + chunk);
      if (off[p0] == off[p1]) return;  // pairs without edges: no gradient
      const Chunk k = make_chunk(p0, p1, feats, Y, mlp, spline, L, order, off, ordered, NP, C);
      const int64_t Ec = k.edges.size(0);
      at::Tensor gw = at::zeros_like(k.w);  // per pair: each sums its edges
      at::Tensor gYc = spline ? at::Tensor() : at::zeros_like(k.Y);
      for (size_t t = 0; t < L.terms.size(); ++t) {
        at::Tensor gT = at::empty_like(k.T[t]);
        at::Tensor none;
        edge_contraction_backward_accumulate(need_gx ? acc[t] : none, gw, gT, gs[t], k.w, k.T[t], xs[t], k.recv,
                                             k.send, L.row_path[t], k.local);
        if (spline) {  // the engine: straight into gY's rows
          L.sparse[t]->tables_backward(gT.view({Ec, -1}), k.edges, gY);
        } else {
          gYc.addmm_(gT.view({Ec, -1}), L.coupling[t].t());  // T = Y M
        }
      }
      if (!spline) gY.index_copy_(0, k.edges, gYc);
      // Back through the MLP (or the spline), per pair.
      at::Tensor g = gw.view({p1 - p0, NP * C});
      if (spline) {  // ∂/∂r of the spline: feats holds the distances
        gfeats.slice(0, p0, p1).select(1, 0).copy_(spline->backward(feats.slice(0, p0, p1).select(1, 0), g));
        return;
      }
      for (size_t m = mlp.size(); m-- > 0;) {
        g = at::mm(g, mlp[m].t());  // ∂/∂ of layer m's input h[m]
        if (m > 0) {
          const at::Tensor& zm = k.z[m - 1];
          const at::Tensor sig = at::sigmoid(zm);
          g = g * sig * (1.0 + zm * (1.0 - sig));  // silu'
        }
      }
      gfeats.slice(0, p0, p1).copy_(g);
    });
    // Terms without paths get no gradient.
    at::Tensor gx_full;
    if (need_gx) {
      gx_full = at::zeros_like(x);
      for (size_t t = 0; t < L.terms.size(); ++t) gx_full.narrow(1, L.term_offset[t], L.term_dim[t]).copy_(gx[t]);
    }
    variable_list out{gx_full, ctx->needs_input_grad(1) ? gY : at::Tensor(),
                      ctx->needs_input_grad(2) ? gfeats : at::Tensor()};
    for (size_t m = 0; m < num_mlp; ++m) out.emplace_back();
    for (int k = 0; k < 8; ++k) out.emplace_back();  // edge_pair … chunk
    return out;
  }
};

}  // namespace

at::Tensor chunked_aggregate(const at::Tensor& x, const at::Tensor& Y, const at::Tensor& feats,
                             const std::vector<at::Tensor>& mlp, const ConvTensorProduct& tp, const PairEdges& edges,
                             int64_t chunk, const RadialSpline* spline) {
  TORCH_CHECK(x.dim() == 3 && Y.dim() == 2 && feats.dim() == 2 && !mlp.empty(),
              "chunked_aggregate: x [N,D,C], Y [E,Dsh], feats [P,nb] and an MLP expected");
  TORCH_CHECK(Y.size(0) == edges.order.size(0) && feats.size(0) + 1 == edges.offsets.size(0),
              "chunked_aggregate: Y must have a row per edge and feats a row per pair");
  TORCH_CHECK((spline ? spline->num_outputs() : mlp.back().size(1)) == tp.num_paths() * x.size(2),
              "chunked_aggregate: the radial weights must have num_paths · C columns");
  TORCH_CHECK(!spline || (feats.size(1) == 1 && spline->dtype() == x.scalar_type() && x.device().is_cpu()),
              "chunked_aggregate: with a spline, feats must be the distances [P,1] and the spline x's dtype, on CPU");
  TORCH_CHECK(x.scalar_type() == Y.scalar_type() && x.scalar_type() == feats.scalar_type(),
              "chunked_aggregate: x, Y and feats must share one dtype");
  TORCH_CHECK(chunk >= 1, "chunked_aggregate: chunk must be >= 1");
  // The engine reads Y's rows and the chunks' edge indices in place.
  return ChunkedAggregate::apply(x, spline ? Y.contiguous() : Y, feats, at::TensorList(mlp), edges.edge_pair,
                                 spline ? edges.order.contiguous() : edges.order, edges.offsets,
                                 edges.receiver, edges.sender, &tp, spline, chunk);
}

}  // namespace crucible::mace
