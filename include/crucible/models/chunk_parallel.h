#pragma once
// Chunks of edges split among threads, each summing into its own
// node-sized accumulators (the inference path's kernels, issue 19).

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace crucible {

/// at::parallel_for(begin, end, grain, f), with the caller's thread-local
/// state (grad mode, autocast, inference mode: at::ThreadLocalState) set on
/// every worker thread for f: LibTorch 1.13's OpenMP backend starts workers
/// with their own defaults (grad on, autocast off), so an op in f would run
/// otherwise on a worker than on the calling thread. Nested calls (inside a
/// parallel region) run f on the calling thread. Exceptions from f propagate.
template <class F>
void parallel_for_with_state(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const at::ThreadLocalState state;
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    at::ThreadLocalStateGuard guard(state);
    f(b, e);
  });
}

/// Runs body(c, acc) for every chunk c in [0, num_chunks), split into
/// contiguous ranges among at::get_num_threads() threads. Each thread gets
/// its own accumulators, zeros shaped like `like` (one tensor per entry);
/// the returned accumulators are their sums. Thread ranges are fixed by
/// ATen, and sums are taken in thread order, so a result changes with the
/// thread count only by rounding. body runs with the caller's grad mode and
/// autocast state (parallel_for_with_state). Exceptions from body propagate.
template <class Body>
std::vector<at::Tensor> sum_over_chunks(int64_t num_chunks, const std::vector<at::Tensor>& like, const Body& body) {
  auto zeros = [&] {
    std::vector<at::Tensor> acc;
    for (const auto& t : like) acc.push_back(at::zeros_like(t, at::MemoryFormat::Contiguous));
    return acc;
  };
  const int threads = at::get_num_threads();
  if (threads <= 1 || num_chunks < 2) {
    std::vector<at::Tensor> acc = zeros();
    for (int64_t c = 0; c < num_chunks; ++c) body(c, acc);
    return acc;
  }
  std::vector<std::vector<at::Tensor>> per_thread(static_cast<size_t>(threads));
  parallel_for_with_state(0, num_chunks, 1, [&](int64_t begin, int64_t end) {
    auto& mine = per_thread[static_cast<size_t>(at::get_thread_num())];
    if (mine.empty()) mine = zeros();
    for (int64_t c = begin; c < end; ++c) body(c, mine);
  });
  std::vector<at::Tensor> total;
  for (auto& acc : per_thread) {
    if (acc.empty()) continue;
    if (total.empty()) {
      total = acc;
    } else {
      for (size_t k = 0; k < acc.size(); ++k) total[k].add_(acc[k]);
    }
  }
  return total.empty() ? zeros() : total;
}

/// out = cat over row chunks of f(x[begin:end], begin, end), [N, ...]: a
/// per-row function (e.g. MACE's product basis, node by node) evaluated
/// `chunk` rows at a time with gradients off, and recomputed chunk by chunk
/// in the backward (gradient checkpointing, Chen et al. 2016, arXiv
/// 1604.06174), so that its intermediates never exist for more than one
/// chunk. The backward gives ∂/∂x only, first order, with f's autograd;
/// anything else f reads gets no gradient (the inference path's contract).
/// f must return [end - begin, ...] with the same trailing shape for every
/// chunk and may not keep references to x_rows. @throws std::runtime_error
/// from the backward if asked for a differentiable backward (create_graph).
at::Tensor checkpointed_rows(const at::Tensor& x, int64_t chunk,
                             std::function<at::Tensor(const at::Tensor& x_rows, int64_t begin, int64_t end)> f);

/// out = cat over row chunks of f(rows of xs, begin, end), [N, ...], where
/// every xs[i] is [N, ...] and f is per row (row n of out depends on row n
/// of each xs[i] only; e.g. MACE's product basis with its per-node element
/// weights). Unlike checkpointed_rows the backward is differentiable once:
/// gradients to every xs[i] and their derivatives (forces, then the
/// parameter gradients of a force loss, the training path) are recomputed
/// chunk by chunk, so f's intermediates never exist for more than one chunk
/// in the forward, the backward or the double backward (gradient
/// checkpointing, Chen et al. 2016, arXiv 1604.06174). Costs about twice
/// f's share of a training step. xs may be undefined (passed to f as
/// undefined) or need no gradient. f must return [end - begin, ...] with
/// one trailing shape and may not keep references to its rows.
/// @throws std::invalid_argument if chunk < 1, no xs is defined, one is
///         not floating-point or they have different row counts;
///         std::runtime_error from a third-order backward.
at::Tensor checkpointed_rows_twice(const std::vector<at::Tensor>& xs, int64_t chunk,
                                   std::function<at::Tensor(const std::vector<at::Tensor>& rows, int64_t begin,
                                                            int64_t end)>
                                       f);

}  // namespace crucible
