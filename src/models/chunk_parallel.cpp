// Gradient checkpointing over row chunks. See
// include/crucible/models/chunk_parallel.h.

#include "crucible/models/chunk_parallel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/core/ivalue.h>

#include <stdexcept>
#include <vector>

namespace crucible {
namespace {

using RowFn = std::function<at::Tensor(const at::Tensor&, int64_t, int64_t)>;

struct RowFnHolder : torch::CustomClassHolder {
  explicit RowFnHolder(RowFn fn) : f(std::move(fn)) {}
  RowFn f;
};

struct CheckpointedRows : public torch::autograd::Function<CheckpointedRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t chunk,
                            c10::intrusive_ptr<RowFnHolder> holder) {
    ctx->save_for_backward({x});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["f"] = c10::IValue::make_capsule(holder);
    const int64_t N = x.size(0);
    const int64_t num_chunks = (N + chunk - 1) / chunk;
    if (num_chunks == 0) return holder->f(x, 0, 0);
    std::vector<at::Tensor> parts(static_cast<size_t>(num_chunks));
    // Chunks are independent: threads take contiguous ranges of them.
    at::parallel_for(0, num_chunks, 1, [&](int64_t cb, int64_t ce) {
      at::NoGradGuard no_grad;  // thread-local: set on every worker
      for (int64_t c = cb; c < ce; ++c) {
        const int64_t b = c * chunk, e = std::min(N, b + chunk);
        parts[static_cast<size_t>(c)] = holder->f(x.slice(0, b, e), b, e);
      }
    });
    return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error("inference path: no differentiable backward (create_graph); use ComputeOptions::training");
    }
    const at::Tensor x = ctx->get_saved_variables()[0];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    auto holder = c10::static_intrusive_pointer_cast<RowFnHolder>(ctx->saved_data["f"].toCapsule());
    const at::Tensor g = grads[0];
    at::Tensor gx = at::zeros_like(x);
    const int64_t N = x.size(0);
    const int64_t num_chunks = (N + chunk - 1) / chunk;
    // Each thread differentiates its own chunks (the autograd engine runs a
    // CPU graph on the calling thread; rows of gx are disjoint).
    at::parallel_for(0, num_chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        const int64_t b = c * chunk, e = std::min(N, b + chunk);
        at::Tensor grad_rows;
        {
          at::AutoGradMode enable(true);
          const at::Tensor xr = x.slice(0, b, e).detach().requires_grad_(true);
          const at::Tensor y = holder->f(xr, b, e);
          if (!y.requires_grad()) continue;
          grad_rows = torch::autograd::grad({y}, {xr}, {g.slice(0, b, e)}, /*retain_graph=*/false,
                                            /*create_graph=*/false, /*allow_unused=*/true)[0];
        }
        if (grad_rows.defined()) gx.slice(0, b, e).copy_(grad_rows);
      }
    });
    return {gx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpointed_rows(const at::Tensor& x, int64_t chunk, RowFn f) {
  if (chunk < 1) throw std::invalid_argument("checkpointed_rows: chunk must be >= 1");
  return CheckpointedRows::apply(x, chunk, c10::make_intrusive<RowFnHolder>(std::move(f)));
}

}  // namespace crucible
