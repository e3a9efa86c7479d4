// Fused edge contraction and its derivatives. See
// include/crucible/models/mace/edge_contraction.h.

#include "crucible/models/mace/edge_contraction.h"
#include "../../simd_clones.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <vector>

namespace crucible::mace {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

struct Sizes {
  int64_t N, E, P, R, D, C;
  /// kWeights: `out` is uninitialised and each edge's [P, C] block is zeroed
  /// just before it is summed into (in cache, not a separate pass).
  bool fresh_weights = false;
  /// Weight rows per pair (edge_contraction's w_pair): w row of edge e is
  /// w_row[e]; the kWeights slot runs over pairs q, summing the edges
  /// pair_order[pair_offsets[q] .. pair_offsets[q+1]). Null: one row per edge.
  const int64_t* w_row = nullptr;
  const int64_t* pair_order = nullptr;
  const int64_t* pair_offsets = nullptr;
  int64_t W = 0;  ///< rows of w: E, or the number of pairs
};

CRUCIBLE_INLINE_IN_CLONES int64_t weight_row(const Sizes& z, int64_t e) { return z.w_row ? z.w_row[e] : e; }

// The loops vectorise over channels c, built per ISA (simd_clones.h).

// acc[c] = Σ_i t[i] x[i, c]: one table row against the sender's [D, C]
// features (the message and weights slots).
template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES void contract_components(const S* __restrict t, const S* __restrict x, int64_t D,
                                                   int64_t channels, S* __restrict acc) {
  const int64_t C = CC > 0 ? CC : channels;
  const S t0 = t[0];
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) acc[c] = t0 * x[c];
  for (int64_t i = 1; i < D; ++i) {
    const S ti = t[i];
    const S* __restrict xi = x + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) acc[c] += ti * xi[c];
  }
}

template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES void message_loop(const S* __restrict g, const S* __restrict w, const S* __restrict T,
                                            const S* __restrict x, const int64_t* recv, const int64_t* send,
                                            const int64_t* path, S* __restrict out, const Sizes& z,
                                            S* __restrict acc_buf) {
  // A compile-time channel count keeps the row accumulator in registers.
  S acc_local[CC > 0 ? CC : 1];
  S* __restrict acc = CC > 0 ? acc_local : acc_buf;
  (void)g;
  const int64_t R = z.R, D = z.D, C = CC > 0 ? CC : z.C, P = z.P;
  for (int64_t e = 0; e < z.E; ++e) {
    const S* __restrict xs = x + send[e] * D * C;
    S* __restrict o = out + recv[e] * R * C;
    for (int64_t r = 0; r < R; ++r) {
      const S* t = T + (e * R + r) * D;
      const S* __restrict we = w + (weight_row(z, e) * P + path[r]) * C;
      contract_components<S, CC>(t, xs, D, C, acc);
      S* __restrict orow = o + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) orow[c] += we[c] * acc[c];
    }
  }
}

template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES void input_loop(const S* __restrict g, const S* __restrict w, const S* __restrict T,
                                          const int64_t* recv, const int64_t* send, const int64_t* path,
                                          S* __restrict out, const Sizes& z, S* __restrict tmp_buf) {
  // A compile-time channel count keeps the row accumulator in registers.
  S tmp_local[CC > 0 ? CC : 1];
  S* __restrict tmp = CC > 0 ? tmp_local : tmp_buf;
  const int64_t R = z.R, D = z.D, C = CC > 0 ? CC : z.C, P = z.P;
  for (int64_t e = 0; e < z.E; ++e) {
    const S* __restrict gr = g + recv[e] * R * C;
    S* __restrict o = out + send[e] * D * C;
    for (int64_t r = 0; r < R; ++r) {
      const S* t = T + (e * R + r) * D;
      const S* __restrict we = w + (weight_row(z, e) * P + path[r]) * C;
      const S* __restrict grr = gr + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) tmp[c] = we[c] * grr[c];
      for (int64_t i = 0; i < D; ++i) {
        const S ti = t[i];
        S* __restrict orow = o + i * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) orow[c] += ti * tmp[c];
      }
    }
  }
}

// out[row, p, c] += g[recv, r, c] Σ_i T[e, r, i] x[send, i, c] for edge e into
// its weight row; with pairs, `begin`..`end` are pairs and each sums its edges.
template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES void weights_edge(const S* __restrict g, const S* __restrict T, const S* __restrict x,
                                            const int64_t* recv, const int64_t* send, const int64_t* path,
                                            S* __restrict o, const Sizes& z, int64_t e, S* __restrict acc_buf) {
  // A compile-time channel count keeps the row accumulator in registers.
  S acc_local[CC > 0 ? CC : 1];
  S* __restrict acc = CC > 0 ? acc_local : acc_buf;
  const int64_t R = z.R, D = z.D, C = CC > 0 ? CC : z.C;
  const S* __restrict xs = x + send[e] * D * C;
  const S* __restrict gr = g + recv[e] * R * C;
  for (int64_t r = 0; r < R; ++r) {
    const S* t = T + (e * R + r) * D;
    contract_components<S, CC>(t, xs, D, C, acc);
    S* __restrict orow = o + path[r] * C;
    const S* __restrict grr = gr + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) orow[c] += grr[c] * acc[c];
  }
}

template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES void weights_loop(const S* __restrict g, const S* __restrict T, const S* __restrict x,
                                            const int64_t* recv, const int64_t* send, const int64_t* path,
                                            S* __restrict out, const Sizes& z, int64_t begin, int64_t end,
                                            S* __restrict acc) {
  const int64_t PC = z.P * (CC > 0 ? CC : z.C);
  for (int64_t q = begin; q < end; ++q) {
    S* __restrict o = out + q * PC;
    if (z.fresh_weights) std::fill(o, o + PC, S(0));
    if (!z.w_row) {
      weights_edge<S, CC>(g, T, x, recv, send, path, o, z, q, acc);
      continue;
    }
    for (int64_t k = z.pair_offsets[q]; k < z.pair_offsets[q + 1]; ++k)
      weights_edge<S, CC>(g, T, x, recv, send, path, o, z, z.pair_order[k], acc);
  }
}

// Σ_c a[c] b[c] with kLanes partial sums added as a tree at the end: the
// compiler's reduction of an `omp simd` sum was a chain of 16 dependent
// scalar adds per call, half of table_f's time in perf (Zen 5, C = 32).
constexpr int64_t kLanes = 16;
template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES S dot_tree(const S* __restrict a, const S* __restrict b, int64_t len) {
  const int64_t n = CC > 0 ? CC : len;
  S part[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) part[l] += a[c + l] * b[c + l];
  }
  if constexpr (CC == 0 || CC % kLanes != 0) {
    for (int64_t l = 0; c < n; ++c, ++l) part[l] += a[c] * b[c];
  }
  // Each level into a fresh array: in place, GCC spilled the partial sums
  // to the stack and read them back narrower (store-forwarding stalls, a
  // third of the backward loop's time in perf).
  S p8[8], p4[4];
#pragma omp simd
  for (int64_t l = 0; l < 8; ++l) p8[l] = part[l] + part[l + 8];
#pragma omp simd
  for (int64_t l = 0; l < 4; ++l) p4[l] = p8[l] + p8[l + 4];
  return (p4[0] + p4[2]) + (p4[1] + p4[3]);
}

template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES void table_loop(const S* __restrict g, const S* __restrict w, const S* __restrict x,
                                          const int64_t* recv, const int64_t* send, const int64_t* path,
                                          S* __restrict out, const Sizes& z, int64_t begin, int64_t end,
                                          S* __restrict tmp_buf) {
  // A compile-time channel count keeps the row accumulator in registers.
  S tmp_local[CC > 0 ? CC : 1];
  S* __restrict tmp = CC > 0 ? tmp_local : tmp_buf;
  const int64_t R = z.R, D = z.D, C = CC > 0 ? CC : z.C, P = z.P;
  for (int64_t e = begin; e < end; ++e) {
    const S* __restrict xs = x + send[e] * D * C;
    const S* __restrict gr = g + recv[e] * R * C;
    for (int64_t r = 0; r < R; ++r) {
      const S* __restrict we = w + (weight_row(z, e) * P + path[r]) * C;
      const S* __restrict grr = gr + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) tmp[c] = we[c] * grr[c];
      S* o = out + (e * R + r) * D;
      for (int64_t i = 0; i < D; ++i) o[i] = dot_tree<S, CC>(tmp, xs + i * C, C);
    }
  }
}

// The message slot's three first derivatives in one pass over the edges
// (the inference path's backward, issue 48): per edge and row, u = w ⊙ g
// once and the sender's [D, C] rows once for
//   gx[send, i, c] += T[e, r, i] u[c]           (kInput)
//   gT[e, r, i]     = Σ_c u[c] x[send, i, c]     (kTable)
//   gw[row e, p, c] += g[r, c] Σ_i T[e, r, i] x[send, i, c]   (kWeights)
// Serial: gx and gw are the caller's (per-thread) accumulators.
template <class S, int64_t CC>
CRUCIBLE_INLINE_IN_CLONES void backward_loop(const S* __restrict g, const S* __restrict w, const S* __restrict T,
                                             const S* __restrict x, const int64_t* recv, const int64_t* send,
                                             const int64_t* path, S* __restrict gx, S* __restrict gw,
                                             S* __restrict gT, const Sizes& z, S* __restrict buf) {
  S u_local[CC > 0 ? CC : 1], acc_local[CC > 0 ? CC : 1];
  S* __restrict u = CC > 0 ? u_local : buf;
  S* __restrict acc = CC > 0 ? acc_local : buf + z.C;
  const int64_t R = z.R, D = z.D, C = CC > 0 ? CC : z.C, P = z.P;
  const bool with_gx = gx != nullptr;  // null: x is a constant (the first layer's embedding)
  for (int64_t e = 0; e < z.E; ++e) {
    const S* __restrict xs = x + send[e] * D * C;
    S* __restrict gxs = with_gx ? gx + send[e] * D * C : nullptr;
    const S* __restrict gr = g + recv[e] * R * C;
    const int64_t row = weight_row(z, e);
    for (int64_t r = 0; r < R; ++r) {
      const S* __restrict we = w + (row * P + path[r]) * C;
      const S* __restrict grr = gr + r * C;
      const S* __restrict t = T + (e * R + r) * D;
      S* __restrict o = gT + (e * R + r) * D;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) u[c] = we[c] * grr[c];
      for (int64_t i = 0; i < D; ++i) {
        const S ti = t[i];
        const S* __restrict xi = xs + i * C;
        S* __restrict gxi = with_gx ? gxs + i * C : nullptr;
        o[i] = dot_tree<S, CC>(u, xi, C);
        if (i == 0) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) acc[c] = ti * xi[c];
        } else {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) acc[c] += ti * xi[c];
        }
        if (!with_gx) continue;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) gxi[c] += ti * u[c];
      }
      S* __restrict gwr = gw + (row * P + path[r]) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) gwr[c] += grr[c] * acc[c];
    }
  }
}

// One instantiation per dtype and loop, each cloned for the vector ISAs.
CRUCIBLE_SIMD_CLONES void message_f(const float* g, const float* w, const float* T, const float* x, const int64_t* rv,
                                    const int64_t* sd, const int64_t* p, float* o, const Sizes& z, float* a) {
  message_loop<float, 0>(g, w, T, x, rv, sd, p, o, z, a);
}
CRUCIBLE_SIMD_CLONES void message_d(const double* g, const double* w, const double* T, const double* x,
                                    const int64_t* rv, const int64_t* sd, const int64_t* p, double* o, const Sizes& z,
                                    double* a) {
  message_loop<double, 0>(g, w, T, x, rv, sd, p, o, z, a);
}
CRUCIBLE_SIMD_CLONES void input_f(const float* g, const float* w, const float* T, const int64_t* rv, const int64_t* sd,
                                  const int64_t* p, float* o, const Sizes& z, float* a) {
  input_loop<float, 0>(g, w, T, rv, sd, p, o, z, a);
}
CRUCIBLE_SIMD_CLONES void input_d(const double* g, const double* w, const double* T, const int64_t* rv,
                                  const int64_t* sd, const int64_t* p, double* o, const Sizes& z, double* a) {
  input_loop<double, 0>(g, w, T, rv, sd, p, o, z, a);
}
CRUCIBLE_SIMD_CLONES void weights_f(const float* g, const float* T, const float* x, const int64_t* rv,
                                    const int64_t* sd, const int64_t* p, float* o, const Sizes& z, int64_t b,
                                    int64_t e, float* a) {
  weights_loop<float, 0>(g, T, x, rv, sd, p, o, z, b, e, a);
}
CRUCIBLE_SIMD_CLONES void weights_d(const double* g, const double* T, const double* x, const int64_t* rv,
                                    const int64_t* sd, const int64_t* p, double* o, const Sizes& z, int64_t b,
                                    int64_t e, double* a) {
  weights_loop<double, 0>(g, T, x, rv, sd, p, o, z, b, e, a);
}
CRUCIBLE_SIMD_CLONES void table_f(const float* g, const float* w, const float* x, const int64_t* rv, const int64_t* sd,
                                  const int64_t* p, float* o, const Sizes& z, int64_t b, int64_t e, float* a) {
  table_loop<float, 0>(g, w, x, rv, sd, p, o, z, b, e, a);
}
CRUCIBLE_SIMD_CLONES void table_d(const double* g, const double* w, const double* x, const int64_t* rv,
                                  const int64_t* sd, const int64_t* p, double* o, const Sizes& z, int64_t b,
                                  int64_t e, double* a) {
  table_loop<double, 0>(g, w, x, rv, sd, p, o, z, b, e, a);
}

CRUCIBLE_SIMD_CLONES void backward_f(const float* g, const float* w, const float* T, const float* x,
                                     const int64_t* rv, const int64_t* sd, const int64_t* p, float* gx, float* gw,
                                     float* gT, const Sizes& z, float* a) {
  backward_loop<float, 0>(g, w, T, x, rv, sd, p, gx, gw, gT, z, a);
}
CRUCIBLE_SIMD_CLONES void backward_d(const double* g, const double* w, const double* T, const double* x,
                                     const int64_t* rv, const int64_t* sd, const int64_t* p, double* gx, double* gw,
                                     double* gT, const Sizes& z, double* a) {
  backward_loop<double, 0>(g, w, T, x, rv, sd, p, gx, gw, gT, z, a);
}

// float32 with 32, 64 or 128 channels (MACE's default 32x0e+32x1o; 64 and
// 128 as in MACE-MP's models): the channel loops and row accumulators have
// a compile-time size, so the accumulators stay in registers.
#define CRUCIBLE_EDGE_FIXED_C(CC)                                                                                    \
  CRUCIBLE_SIMD_CLONES void message_f##CC(const float* g, const float* w, const float* T, const float* x,             \
                                          const int64_t* rv, const int64_t* sd, const int64_t* p, float* o,           \
                                          const Sizes& z, float* a) {                                                 \
    message_loop<float, CC>(g, w, T, x, rv, sd, p, o, z, a);                                                         \
  }                                                                                                                   \
  CRUCIBLE_SIMD_CLONES void input_f##CC(const float* g, const float* w, const float* T, const int64_t* rv,            \
                                        const int64_t* sd, const int64_t* p, float* o, const Sizes& z, float* a) {    \
    input_loop<float, CC>(g, w, T, rv, sd, p, o, z, a);                                                              \
  }                                                                                                                   \
  CRUCIBLE_SIMD_CLONES void weights_f##CC(const float* g, const float* T, const float* x, const int64_t* rv,          \
                                          const int64_t* sd, const int64_t* p, float* o, const Sizes& z, int64_t b,   \
                                          int64_t e, float* a) {                                                      \
    weights_loop<float, CC>(g, T, x, rv, sd, p, o, z, b, e, a);                                                      \
  }                                                                                                                   \
  CRUCIBLE_SIMD_CLONES void table_f##CC(const float* g, const float* w, const float* x, const int64_t* rv,            \
                                        const int64_t* sd, const int64_t* p, float* o, const Sizes& z, int64_t b,     \
                                        int64_t e, float* a) {                                                        \
    table_loop<float, CC>(g, w, x, rv, sd, p, o, z, b, e, a);                                                        \
  }                                                                                                                   \
  CRUCIBLE_SIMD_CLONES void backward_f##CC(const float* g, const float* w, const float* T, const float* x,            \
                                           const int64_t* rv, const int64_t* sd, const int64_t* p, float* gx,         \
                                           float* gw, float* gT, const Sizes& z, float* a) {                          \
    backward_loop<float, CC>(g, w, T, x, rv, sd, p, gx, gw, gT, z, a);                                               \
  }
CRUCIBLE_EDGE_FIXED_C(32)
CRUCIBLE_EDGE_FIXED_C(64)
CRUCIBLE_EDGE_FIXED_C(128)
#undef CRUCIBLE_EDGE_FIXED_C

// Calls NAME_f32 / _f64 / _f128 when z.C is one of those, else NAME_f.
#define CRUCIBLE_BY_CHANNELS(NAME, ...)          \
  switch (z.C) {                                 \
    case 32: NAME##_f32(__VA_ARGS__); break;     \
    case 64: NAME##_f64(__VA_ARGS__); break;     \
    case 128: NAME##_f128(__VA_ARGS__); break;   \
    default: NAME##_f(__VA_ARGS__); break;       \
  }

void message_any(const float* g, const float* w, const float* T, const float* x, const int64_t* rv, const int64_t* sd,
                 const int64_t* p, float* o, const Sizes& z, float* a) {
  CRUCIBLE_BY_CHANNELS(message, g, w, T, x, rv, sd, p, o, z, a)
}
void message_any(const double* g, const double* w, const double* T, const double* x, const int64_t* rv,
                 const int64_t* sd, const int64_t* p, double* o, const Sizes& z, double* a) {
  message_d(g, w, T, x, rv, sd, p, o, z, a);
}
void input_any(const float* g, const float* w, const float* T, const int64_t* rv, const int64_t* sd, const int64_t* p,
               float* o, const Sizes& z, float* a) {
  CRUCIBLE_BY_CHANNELS(input, g, w, T, rv, sd, p, o, z, a)
}
void input_any(const double* g, const double* w, const double* T, const int64_t* rv, const int64_t* sd,
               const int64_t* p, double* o, const Sizes& z, double* a) { input_d(g, w, T, rv, sd, p, o, z, a); }
void weights_any(const float* g, const float* T, const float* x, const int64_t* rv, const int64_t* sd,
                 const int64_t* p, float* o, const Sizes& z, int64_t b, int64_t e, float* a) {
  CRUCIBLE_BY_CHANNELS(weights, g, T, x, rv, sd, p, o, z, b, e, a)
}
void weights_any(const double* g, const double* T, const double* x, const int64_t* rv, const int64_t* sd,
                 const int64_t* p, double* o, const Sizes& z, int64_t b, int64_t e, double* a) {
  weights_d(g, T, x, rv, sd, p, o, z, b, e, a);
}
void table_any(const float* g, const float* w, const float* x, const int64_t* rv, const int64_t* sd, const int64_t* p,
               float* o, const Sizes& z, int64_t b, int64_t e, float* a) {
  CRUCIBLE_BY_CHANNELS(table, g, w, x, rv, sd, p, o, z, b, e, a)
}
void table_any(const double* g, const double* w, const double* x, const int64_t* rv, const int64_t* sd,
               const int64_t* p, double* o, const Sizes& z, int64_t b, int64_t e, double* a) {
  table_d(g, w, x, rv, sd, p, o, z, b, e, a);
}

void backward_any(const float* g, const float* w, const float* T, const float* x, const int64_t* rv,
                  const int64_t* sd, const int64_t* p, float* gx, float* gw, float* gT, const Sizes& z, float* a) {
  CRUCIBLE_BY_CHANNELS(backward, g, w, T, x, rv, sd, p, gx, gw, gT, z, a)
}
void backward_any(const double* g, const double* w, const double* T, const double* x, const int64_t* rv,
                  const int64_t* sd, const int64_t* p, double* gx, double* gw, double* gT, const Sizes& z, double* a) {
  backward_d(g, w, T, x, rv, sd, p, gx, gw, gT, z, a);
}

#undef CRUCIBLE_BY_CHANNELS

template <class S>
void kernel(EdgeSlot slot, const S* g, const S* w, const S* T, const S* x, const int64_t* recv, const int64_t* send,
            const int64_t* path, S* out, const Sizes& z) {
  switch (slot) {
    case EdgeSlot::kMessage: {  // out[recv, r, c] += w[e, p, c] Σ_i T[e, r, i] x[send, i, c]
      std::vector<S> acc(static_cast<size_t>(z.C));
      message_any(g, w, T, x, recv, send, path, out, z, acc.data());
      break;
    }
    case EdgeSlot::kInput: {  // out[send, i, c] += Σ_r T[e, r, i] w[e, p, c] g[recv, r, c]
      std::vector<S> tmp(static_cast<size_t>(z.C));
      input_any(g, w, T, recv, send, path, out, z, tmp.data());
      break;
    }
    case EdgeSlot::kWeights: {  // out[e, p, c] += g[recv, r, c] Σ_i T[e, r, i] x[send, i, c]
      at::parallel_for(0, z.W, 256, [&](int64_t begin, int64_t end) {  // weight rows: edges or pairs
        std::vector<S> acc(static_cast<size_t>(z.C));
        weights_any(g, T, x, recv, send, path, out, z, begin, end, acc.data());
      });
      break;
    }
    case EdgeSlot::kTable: {  // out[e, r, i] = Σ_c w[e, p, c] g[recv, r, c] x[send, i, c]
      at::parallel_for(0, z.E, 256, [&](int64_t begin, int64_t end) {
        std::vector<S> tmp(static_cast<size_t>(z.C));
        table_any(g, w, x, recv, send, path, out, z, begin, end, tmp.data());
      });
      break;
    }
  }
}

/// The same with tensor operations (other devices / dtypes).
/// `pair` [E] (undefined: one w row per edge) maps edges to w's rows.
at::Tensor composite(EdgeSlot slot, const at::Tensor& g, const at::Tensor& w_rows, const at::Tensor& T,
                     const at::Tensor& x, const at::Tensor& recv, const at::Tensor& send, const at::Tensor& path,
                     const at::Tensor& pair, const Sizes& z) {
  const at::Tensor w = pair.defined() && w_rows.defined() && w_rows.numel() > 0 ? w_rows.index_select(0, pair) : w_rows;
  switch (slot) {
    case EdgeSlot::kMessage: {
      const at::Tensor m = (T.unsqueeze(-1) * x.index_select(0, send).unsqueeze(1)).sum(2);  // [E, R, C]
      return at::zeros({z.N, z.R, z.C}, w.options()).index_add(0, recv, m * w.index_select(1, path));
    }
    case EdgeSlot::kInput: {
      const at::Tensor tmp = w.index_select(1, path) * g.index_select(0, recv);  // [E, R, C]
      const at::Tensor m = (T.unsqueeze(-1) * tmp.unsqueeze(2)).sum(1);           // [E, D, C]
      return at::zeros({z.N, z.D, z.C}, w.options()).index_add(0, send, m);
    }
    case EdgeSlot::kWeights: {
      const at::Tensor acc = (T.unsqueeze(-1) * x.index_select(0, send).unsqueeze(1)).sum(2);  // [E, R, C]
      const at::Tensor per_edge = at::zeros({z.E, z.P, z.C}, x.options()).index_add(1, path, acc * g.index_select(0, recv));
      return pair.defined() ? at::zeros({z.W, z.P, z.C}, x.options()).index_add(0, pair, per_edge) : per_edge;
    }
    case EdgeSlot::kTable: {
      const at::Tensor tmp = w.index_select(1, path) * g.index_select(0, recv);  // [E, R, C]
      return at::bmm(tmp, x.index_select(0, send).transpose(1, 2));            // [E, R, D]
    }
  }
  return at::Tensor();
}

/// pair / order / offsets: undefined, or the weight row of each edge and
/// the edges grouped by it (group_edges_by_pair).
at::Tensor contraction_forward(EdgeSlot slot, const at::Tensor& g, const at::Tensor& w, const at::Tensor& T,
                               const at::Tensor& x, const at::Tensor& recv, const at::Tensor& send,
                               const at::Tensor& path, const at::Tensor& pair, const at::Tensor& order,
                               const at::Tensor& offsets, const Sizes& z) {
  const std::array<const at::Tensor*, 4> all{&g, &w, &T, &x};  // all[slot] is a placeholder
  const at::Tensor* ref = nullptr;
  for (int k = 0; k < 4; ++k)
    if (k != static_cast<int>(slot)) ref = ref ? ref : all[static_cast<size_t>(k)];
  const bool fused = ref->device().is_cpu() && (ref->scalar_type() == at::kFloat || ref->scalar_type() == at::kDouble);
  for (int k = 0; k < 4; ++k) {
    if (k == static_cast<int>(slot)) continue;
    TORCH_CHECK(all[static_cast<size_t>(k)]->scalar_type() == ref->scalar_type() &&
                    all[static_cast<size_t>(k)]->device() == ref->device(),
                "edge_contraction: all tensors must share dtype and device");
  }
  if (!fused) return composite(slot, g, w, T, x, recv, send, path, pair, z);
  const at::Tensor gc = g.defined() ? g.contiguous() : g, wc = w.defined() ? w.contiguous() : w;
  const at::Tensor tc = T.defined() ? T.contiguous() : T, xc = x.defined() ? x.contiguous() : x;
  const at::Tensor rc = recv.contiguous(), sc = send.contiguous(), pc = path.contiguous();
  std::vector<int64_t> shape;
  switch (slot) {
    case EdgeSlot::kMessage: shape = {z.N, z.R, z.C}; break;
    case EdgeSlot::kWeights: shape = {z.W, z.P, z.C}; break;
    case EdgeSlot::kTable: shape = {z.E, z.R, z.D}; break;
    case EdgeSlot::kInput: shape = {z.N, z.D, z.C}; break;
  }
  // The table slot is written in full and the weights slot zeroes each
  // edge's block itself (a zero fill of [E, P, C] was 8% of a MACE training
  // step in the profile); the node-shaped slots accumulate.
  const bool whole = slot == EdgeSlot::kTable || slot == EdgeSlot::kWeights;
  at::Tensor out = whole ? at::empty(shape, ref->options()) : at::zeros(shape, ref->options());
  Sizes zs = z;
  zs.fresh_weights = slot == EdgeSlot::kWeights;
  at::Tensor pairc, orderc, offsetsc;  // kept alive while the kernel runs
  if (pair.defined()) {
    pairc = pair.contiguous();
    orderc = order.contiguous();
    offsetsc = offsets.contiguous();
    zs.w_row = pairc.data_ptr<int64_t>();
    zs.pair_order = orderc.data_ptr<int64_t>();
    zs.pair_offsets = offsetsc.data_ptr<int64_t>();
  }
  AT_DISPATCH_FLOATING_TYPES(ref->scalar_type(), "edge_contraction", [&] {
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<scalar_t>() : nullptr; };
    kernel<scalar_t>(slot, ptr(gc), ptr(wc), ptr(tc), ptr(xc), rc.data_ptr<int64_t>(), sc.data_ptr<int64_t>(),
                     pc.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), zs);
  });
  return out;
}

struct EdgeContractionFn : public Function<EdgeContractionFn> {
  static at::Tensor forward(AutogradContext* ctx, int64_t slot, const at::Tensor& g, const at::Tensor& w,
                            const at::Tensor& T, const at::Tensor& x, const at::Tensor& recv, const at::Tensor& send,
                            const at::Tensor& path, const at::Tensor& pair, const at::Tensor& order,
                            const at::Tensor& offsets, std::vector<int64_t> sizes) {
    ctx->saved_data["slot"] = slot;
    ctx->saved_data["sizes"] = sizes;
    // The slot's own argument is an empty placeholder; so are pair / order /
    // offsets without weight pairs (sizes[7] = 0).
    ctx->save_for_backward({g, w, T, x, recv, send, path, pair, order, offsets});
    Sizes z{sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5]};
    z.W = sizes[6];
    const bool paired = sizes[7] != 0;
    return contraction_forward(static_cast<EdgeSlot>(slot), g, w, T, x, recv, send, path,
                               paired ? pair : at::Tensor(), paired ? order : at::Tensor(),
                               paired ? offsets : at::Tensor(), z);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t slot = ctx->saved_data["slot"].toInt();
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    auto s = ctx->get_saved_variables();
    std::array<at::Tensor, 4> t{s[0], s[1], s[2], s[3]};
    t[static_cast<size_t>(slot)] = grads[0];  // the cotangent takes the differentiated slot
    variable_list out(12);
    for (int64_t k = 0; k < 4; ++k) {
      if (k == slot || !ctx->needs_input_grad(static_cast<size_t>(k))) continue;
      std::array<at::Tensor, 4> args = t;
      args[static_cast<size_t>(k)] = at::empty({0}, s[4].options().dtype(grads[0].scalar_type()));
      out[static_cast<size_t>(1 + k)] =
          EdgeContractionFn::apply(k, args[0], args[1], args[2], args[3], s[4], s[5], s[6], s[7], s[8], s[9], sizes);
    }
    return out;
  }
};

}  // namespace

at::Tensor edge_contraction(EdgeSlot slot, const at::Tensor& g, const at::Tensor& w, const at::Tensor& T,
                            const at::Tensor& x, const at::Tensor& receiver, const at::Tensor& sender,
                            const at::Tensor& row_path, int64_t num_nodes, int64_t num_paths, int64_t rows,
                            int64_t dim, int64_t channels, const PairEdges* w_pairs) {
  const int64_t E = receiver.size(0);
  const int64_t W = w_pairs ? w_pairs->offsets.size(0) - 1 : E;  // rows of w
  if (w_pairs) {
    TORCH_CHECK(w_pairs->edge_pair.size(0) == E && w_pairs->order.size(0) == E && w_pairs->offsets.device().is_cpu(),
                "edge_contraction: w_pairs must group the E edges (group_edges_by_pair)");
  }
  TORCH_CHECK(sender.size(0) == E && row_path.size(0) == rows, "edge_contraction: index sizes do not match");
  if (g.defined() && slot != EdgeSlot::kMessage)
    TORCH_CHECK(g.dim() == 3 && g.size(0) == num_nodes && g.size(1) == rows && g.size(2) == channels, "edge_contraction: g must be [N, R, C]");
  if (w.defined() && slot != EdgeSlot::kWeights)
    TORCH_CHECK(w.dim() == 3 && w.size(0) == W && w.size(1) == num_paths && w.size(2) == channels,
                "edge_contraction: w must be [E, P, C] (or [pairs, P, C] with w_pairs)");
  if (T.defined() && slot != EdgeSlot::kTable)
    TORCH_CHECK(T.dim() == 3 && T.size(0) == E && T.size(1) == rows && T.size(2) == dim, "edge_contraction: T must be [E, R, D]");
  if (x.defined() && slot != EdgeSlot::kInput)
    TORCH_CHECK(x.dim() == 3 && x.size(0) == num_nodes && x.size(1) == dim && x.size(2) == channels, "edge_contraction: x must be [N, D, C]");
  const std::vector<int64_t> sizes{num_nodes, E, num_paths, rows, dim, channels, W, w_pairs ? 1 : 0};
  const at::Tensor none = at::empty({0}, receiver.options());
  // The slot's own argument: an empty placeholder (autograd functions take
  // no undefined tensors).
  const at::Tensor any = slot == EdgeSlot::kWeights ? x : w;
  auto arg = [&](EdgeSlot k, const at::Tensor& t) { return k == slot ? at::empty({0}, any.options()) : t; };
  return EdgeContractionFn::apply(static_cast<int64_t>(slot), arg(EdgeSlot::kMessage, g), arg(EdgeSlot::kWeights, w),
                                  arg(EdgeSlot::kTable, T), arg(EdgeSlot::kInput, x), receiver, sender, row_path,
                                  w_pairs ? w_pairs->edge_pair : none, w_pairs ? w_pairs->order : none,
                                  w_pairs ? w_pairs->offsets : none, sizes);
}

void edge_contraction_accumulate(EdgeSlot slot, at::Tensor& out, const at::Tensor& g, const at::Tensor& w,
                                 const at::Tensor& T, const at::Tensor& x, const at::Tensor& receiver,
                                 const at::Tensor& sender, const at::Tensor& row_path, const at::Tensor& w_row) {
  TORCH_CHECK(!w_row.defined() || slot != EdgeSlot::kWeights,
              "edge_contraction_accumulate: w_row is for the slots that read w (use edge_contraction_backward_accumulate)");
  Sizes z{};
  z.E = receiver.size(0);
  z.W = z.E;
  z.R = row_path.size(0);
  z.C = slot == EdgeSlot::kTable ? (x.defined() ? x.size(2) : g.size(2)) : out.size(2);
  z.D = x.defined() ? x.size(1) : (T.defined() ? T.size(2) : out.size(1));
  z.P = w.defined() ? w.size(1) : out.size(1);
  z.N = slot == EdgeSlot::kMessage || slot == EdgeSlot::kInput ? out.size(0) : (x.defined() ? x.size(0) : g.size(0));
  const bool fused = out.device().is_cpu() && (out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble);
  for (const at::Tensor* t : {&g, &w, &T, &x}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->scalar_type() == out.scalar_type() && t->device() == out.device(),
                "edge_contraction_accumulate: all tensors must share dtype and device");
    TORCH_CHECK(!fused || t->is_contiguous(), "edge_contraction_accumulate: CPU tensors must be contiguous");
  }
  if (!fused) {
    const at::Tensor r = composite(slot, g, w, T, x, receiver, sender, row_path, w_row, z);
    if (slot == EdgeSlot::kTable) out.copy_(r);
    else out.add_(r);
    return;
  }
  TORCH_CHECK(out.is_contiguous() && receiver.is_contiguous() && sender.is_contiguous() && row_path.is_contiguous() &&
                  (!w_row.defined() || w_row.is_contiguous()),
              "edge_contraction_accumulate: CPU tensors must be contiguous");
  if (w_row.defined()) z.w_row = w_row.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "edge_contraction_accumulate", [&] {
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<scalar_t>() : nullptr; };
    kernel<scalar_t>(slot, ptr(g), ptr(w), ptr(T), ptr(x), receiver.data_ptr<int64_t>(), sender.data_ptr<int64_t>(),
                     row_path.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), z);
  });
}

void edge_contraction_backward_accumulate(at::Tensor& gx, at::Tensor& gw, at::Tensor& gT, const at::Tensor& g,
                                          const at::Tensor& w, const at::Tensor& T, const at::Tensor& x,
                                          const at::Tensor& receiver, const at::Tensor& sender,
                                          const at::Tensor& row_path, const at::Tensor& w_row) {
  const int64_t E = receiver.size(0), R = row_path.size(0);
  TORCH_CHECK(x.dim() == 3 && g.dim() == 3 && w.dim() == 3 && T.dim() == 3 && g.size(1) == R && T.size(0) == E &&
                  T.size(1) == R && T.size(2) == x.size(1) && g.size(2) == x.size(2) && w.size(2) == x.size(2) &&
                  (!gx.defined() || gx.sizes() == x.sizes()) && gw.sizes() == w.sizes() && gT.sizes() == T.sizes() &&
                  sender.size(0) == E && (!w_row.defined() || w_row.size(0) == E) &&
                  (w_row.defined() || w.size(0) == E),
              "edge_contraction_backward_accumulate: expected g [N,R,C], w [W,P,C], T [E,R,D], x [N,D,C] and "
              "gx, gw, gT shaped as x, w, T");
  const bool fused = x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&g, &w, &T, &gx, &gw, &gT}) {
    if (!t->defined()) continue;  // gx only
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->device() == x.device(),
                "edge_contraction_backward_accumulate: all tensors must share dtype and device");
  }
  if (!fused) {  // the three slots one by one
    Sizes z{};
    z.N = x.size(0), z.E = E, z.P = w.size(1), z.R = R, z.D = x.size(1), z.C = x.size(2), z.W = w.size(0);
    if (gx.defined()) gx.add_(composite(EdgeSlot::kInput, g, w, T, at::Tensor(), receiver, sender, row_path, w_row, z));
    gT.copy_(composite(EdgeSlot::kTable, g, w, at::Tensor(), x, receiver, sender, row_path, w_row, z));
    z.W = E;  // per edge, then summed into w's rows
    const at::Tensor per_edge = composite(EdgeSlot::kWeights, g, at::Tensor(), T, x, receiver, sender, row_path,
                                          at::Tensor(), z);
    if (w_row.defined()) gw.index_add_(0, w_row, per_edge);
    else gw.add_(per_edge);
    return;
  }
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&g, &w, &T, &x, &gx, &gw, &gT, &receiver, &sender, &row_path}) {
    TORCH_CHECK(!t->defined() || t->is_contiguous(), "edge_contraction_backward_accumulate: CPU tensors must be contiguous");
  }
  TORCH_CHECK(!w_row.defined() || w_row.is_contiguous(),
              "edge_contraction_backward_accumulate: CPU tensors must be contiguous");
  Sizes z{};
  z.N = x.size(0), z.E = E, z.P = w.size(1), z.R = R, z.D = x.size(1), z.C = x.size(2), z.W = w.size(0);
  if (w_row.defined()) z.w_row = w_row.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "edge_contraction_backward_accumulate", [&] {
    std::vector<scalar_t> buf(static_cast<size_t>(2 * z.C));
    backward_any(g.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                 receiver.data_ptr<int64_t>(), sender.data_ptr<int64_t>(), row_path.data_ptr<int64_t>(),
                 gx.defined() ? gx.data_ptr<scalar_t>() : nullptr, gw.data_ptr<scalar_t>(), gT.data_ptr<scalar_t>(), z,
                 buf.data());
  });
}

}  // namespace crucible::mace
