// Gradient checkpointing over row chunks. See
// include/crucible/models/chunk_parallel.h.

#include "crucible/models/chunk_parallel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace crucible {
namespace {

using RowFn = std::function<at::Tensor(const at::Tensor&, int64_t, int64_t)>;
using MultiRowFn = std::function<at::Tensor(const std::vector<at::Tensor>&, int64_t, int64_t)>;

/// Runs body(begin, end) for each row chunk, chunks split among threads
/// (contiguous ranges of them; they write disjoint rows), each with the
/// caller's grad mode and autocast state.
template <class Body>
void for_row_chunks(int64_t N, int64_t chunk, const Body& body) {
  const int64_t num_chunks = (N + chunk - 1) / chunk;
  parallel_for_with_state(0, num_chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) body(c * chunk, std::min(N, (c + 1) * chunk));
  });
}

/// Rows [b, e) of every x, detached; leaves that require grad if `grad`.
std::vector<at::Tensor> row_leaves(at::TensorList xs, int64_t b, int64_t e, bool grad) {
  std::vector<at::Tensor> rows;
  for (const auto& x : xs) {
    at::Tensor r = x.slice(0, b, e).detach();
    rows.push_back(grad ? r.requires_grad_(true) : r);
  }
  return rows;
}

void copy_rows(const at::Tensor& src, at::Tensor& dst, int64_t b, int64_t e) {
  if (src.defined()) dst.slice(0, b, e).copy_(src);
}

/// cat over chunks of f(rows of xs), without a graph.
at::Tensor chunked_values(at::TensorList xs, int64_t chunk, const MultiRowFn& f) {
  const int64_t N = xs[0].size(0);
  if (N == 0) return f(row_leaves(xs, 0, 0, false), 0, 0);
  std::vector<at::Tensor> parts(static_cast<size_t>((N + chunk - 1) / chunk));
  for_row_chunks(N, chunk, [&](int64_t b, int64_t e) {
    at::NoGradGuard no_grad;  // no graph for the values, whatever the caller's grad mode
    parts[static_cast<size_t>(b / chunk)] = f(row_leaves(xs, b, e, false), b, e);
  });
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

/// gx_i = J_i^T gy for every x_i, chunk by chunk: each chunk is recomputed
/// with autograd, differentiated (first order, no graph kept) and dropped.
/// Each thread differentiates its own chunks (the autograd engine runs a CPU
/// graph on the calling thread).
std::vector<at::Tensor> chunked_vjp(at::TensorList xs, const at::Tensor& gy, int64_t chunk, const MultiRowFn& f) {
  std::vector<at::Tensor> gx;
  for (const auto& x : xs) gx.push_back(at::zeros_like(x));
  for_row_chunks(xs[0].size(0), chunk, [&](int64_t b, int64_t e) {
    at::AutoGradMode enable(true);
    const std::vector<at::Tensor> rows = row_leaves(xs, b, e, true);
    const at::Tensor y = f(rows, b, e);
    if (!y.requires_grad()) return;
    const auto g = torch::autograd::grad({y}, rows, {gy.slice(0, b, e)}, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < g.size(); ++i) copy_rows(g[i], gx[i], b, e);
  });
  return gx;
}

struct RowFnHolder : torch::CustomClassHolder {
  explicit RowFnHolder(RowFn fn) : f(std::move(fn)) {}
  RowFn f;
  /// f on the single input of a one-element row list.
  MultiRowFn on_lists() const {
    return [this](const std::vector<at::Tensor>& rows, int64_t b, int64_t e) { return f(rows[0], b, e); };
  }
};

struct CheckpointedRows : public torch::autograd::Function<CheckpointedRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t chunk,
                            c10::intrusive_ptr<RowFnHolder> holder) {
    ctx->save_for_backward({x});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["f"] = c10::IValue::make_capsule(holder);
    return chunked_values({x}, chunk, holder->on_lists());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error("inference path: no differentiable backward (create_graph); use ComputeOptions::training");
    }
    const at::Tensor x = ctx->get_saved_variables()[0];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    auto holder = c10::static_intrusive_pointer_cast<RowFnHolder>(ctx->saved_data["f"].toCapsule());
    return {chunked_vjp({x}, grads[0], chunk, holder->on_lists())[0], at::Tensor(), at::Tensor()};
  }
};

// ---- checkpointed_rows_twice ------------------------------------------

struct MultiRowFnHolder : torch::CustomClassHolder {
  MultiRowFnHolder(MultiRowFn fn, int64_t rows_per_chunk) : f(std::move(fn)), chunk(rows_per_chunk) {}
  MultiRowFn f;
  int64_t chunk;
};

/// The vector-Jacobian product of the row function, gx_i = J_i^T gy, by
/// chunks; its backward (the double backward of f) also by chunks.
struct RowsTwiceVjp : public torch::autograd::Function<RowsTwiceVjp> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList xs,
                                                const at::Tensor& gy, c10::intrusive_ptr<MultiRowFnHolder> h) {
    std::vector<at::Tensor> saved(xs.begin(), xs.end());
    saved.push_back(gy);
    ctx->save_for_backward(saved);
    ctx->saved_data["f"] = c10::IValue::make_capsule(h);
    return chunked_vjp(xs, gy, h->chunk, h->f);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list ggs) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error("checkpointed_rows_twice: no third derivative (a backward with create_graph of a "
                               "double backward)");
    }
    const auto saved = ctx->get_saved_variables();
    const size_t n = saved.size() - 1;
    const at::TensorList xs(saved.data(), n);
    const at::Tensor& gy = saved[n];
    auto h = c10::static_intrusive_pointer_cast<MultiRowFnHolder>(ctx->saved_data["f"].toCapsule());
    std::vector<at::Tensor> out;
    for (const auto& x : saved) out.push_back(at::zeros_like(x));
    for_row_chunks(gy.size(0), h->chunk, [&](int64_t b, int64_t e) {
      at::AutoGradMode enable(true);
      std::vector<at::Tensor> leaves = row_leaves(xs, b, e, true);
      const at::Tensor gyc = gy.slice(0, b, e).detach().requires_grad_(true);
      const at::Tensor y = h->f(leaves, b, e);
      if (!y.requires_grad()) return;
      const auto vjp = torch::autograd::grad({y}, leaves, {gyc}, /*retain_graph=*/true, /*create_graph=*/true,
                                             /*allow_unused=*/true);
      // s = Σ_i <gg_i, J_i^T gy>: ∂s/∂gy = Σ_i J_i gg_i, ∂s/∂x = the second-order terms.
      at::Tensor s;
      for (size_t i = 0; i < n; ++i) {
        if (!vjp[i].defined() || !ggs[i].defined()) continue;
        const at::Tensor term = (vjp[i] * ggs[i].slice(0, b, e)).sum();
        s = s.defined() ? s + term : term;
      }
      if (!s.defined() || !s.requires_grad()) return;
      leaves.push_back(gyc);
      const auto d = torch::autograd::grad({s}, leaves, {}, /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
      for (size_t i = 0; i < d.size(); ++i) copy_rows(d[i], out[i], b, e);
    });
    out.emplace_back();  // the holder
    return out;
  }
};

struct RowsTwice : public torch::autograd::Function<RowsTwice> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList xs,
                            c10::intrusive_ptr<MultiRowFnHolder> h) {
    ctx->save_for_backward(std::vector<at::Tensor>(xs.begin(), xs.end()));
    ctx->saved_data["f"] = c10::IValue::make_capsule(h);
    return chunked_values(xs, h->chunk, h->f);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto xs = ctx->get_saved_variables();
    auto h = c10::static_intrusive_pointer_cast<MultiRowFnHolder>(ctx->saved_data["f"].toCapsule());
    torch::autograd::variable_list gx = RowsTwiceVjp::apply(at::TensorList(xs), grads[0], h);
    gx.emplace_back();  // the holder
    return gx;
  }
};

}  // namespace

at::Tensor checkpointed_rows_twice(const std::vector<at::Tensor>& xs, int64_t chunk, MultiRowFn f) {
  if (chunk < 1) throw std::invalid_argument("checkpointed_rows_twice: chunk must be >= 1");
  // Only defined tensors enter the autograd function; f sees the gaps again.
  std::vector<at::Tensor> defined;
  std::vector<size_t> where;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].defined()) continue;
    if (!at::isFloatingType(xs[i].scalar_type())) {
      throw std::invalid_argument("checkpointed_rows_twice: inputs must be floating-point, got " +
                                  std::string(c10::toString(xs[i].scalar_type())));
    }
    if (!defined.empty() && xs[i].size(0) != defined[0].size(0)) {
      throw std::invalid_argument("checkpointed_rows_twice: every input must have the same rows, got " +
                                  std::to_string(defined[0].size(0)) + " and " + std::to_string(xs[i].size(0)));
    }
    defined.push_back(xs[i]);
    where.push_back(i);
  }
  if (defined.empty()) throw std::invalid_argument("checkpointed_rows_twice: no defined input");
  const size_t total = xs.size();
  auto full = [f = std::move(f), where, total](const std::vector<at::Tensor>& rows, int64_t b, int64_t e) {
    std::vector<at::Tensor> all(total);
    for (size_t k = 0; k < where.size(); ++k) all[where[k]] = rows[k];
    return f(all, b, e);
  };
  return RowsTwice::apply(at::TensorList(defined), c10::make_intrusive<MultiRowFnHolder>(std::move(full), chunk));
}

at::Tensor checkpointed_rows(const at::Tensor& x, int64_t chunk, RowFn f) {
  if (chunk < 1) throw std::invalid_argument("checkpointed_rows: chunk must be >= 1");
  return CheckpointedRows::apply(x, chunk, c10::make_intrusive<RowFnHolder>(std::move(f)));
}

}  // namespace crucible
