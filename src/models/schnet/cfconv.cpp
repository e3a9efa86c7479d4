// cfconv / edge_product: fused CPU loops and mutually recursive derivatives.

#include "crucible/models/cfconv.h"
#include "crucible/neighbors/counting_sort.h"
#include "../bf16_bits.h"
#include "../../simd_clones.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace crucible {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

bool fused_ok(const at::Tensor& a, const at::Tensor& b) {
  return a.device().is_cpu() && b.device().is_cpu() && a.scalar_type() == b.scalar_type() &&
         (a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble || a.scalar_type() == at::kBFloat16);
}

// Whether every index is in [0, n): one unsigned compare per index (a
// negative one wraps above n), OR-reduced, so the loop vectorises. The
// min/max pass it replaces ran scalar (no 64-bit vector min/max below
// AVX-512): 2.8% of a bf16-mixed SchNet training step in perf (AMD EPYC
// Zen 5 VM, avx512_bf16).
CRUCIBLE_SIMD_CLONES bool indices_below(const int64_t* p, int64_t count, int64_t n) {
  uint64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad |= static_cast<uint64_t>(p[i]) >= static_cast<uint64_t>(n);
  return bad == 0;
}

// Every index in [0, n), in one pass over the contiguous CPU indices
// (idx.min().item() and idx.max().item() were four dispatched ops and two
// allocations per call, 144 calls per SchNet training step). Only the fused
// CPU loops call it; an index tensor on another device than the features
// is refused here, before a loop would read a device pointer.
void check_indices(const at::Tensor& idx, int64_t n, const char* what) {
  TORCH_CHECK(idx.scalar_type() == at::kLong && idx.dim() == 1, what, " must be a 1-D int64 tensor");
  TORCH_CHECK(idx.is_cpu(), what, " must be on the features' device (cpu), got ", idx.device());
  if (idx.numel() == 0) return;
  const at::Tensor c = idx.contiguous();
  TORCH_CHECK(indices_below(c.data_ptr<int64_t>(), c.numel(), n), what, " must index rows 0..", n - 1);
}

using bf16_bits::widen;  // bf16 as the upper half of a float32 (bf16_bits.h)

// Rows that pair[e] and the gathered indices point to are scattered over
// [P,K] tensors far larger than the caches at MD sizes (37 MB per [P,64]
// float32 at 6912 Cu atoms): the hardware prefetchers cannot guess them, so
// the loops ask for the rows kPrefetchEdges edges ahead.
constexpr int64_t kPrefetchEdges = 32;
// Rows are prefetched while kPrefetchEdges of them fit in a 1 MB L2 (Zen 4/5;
// 2 MB on recent Xeons): MACE's product basis has rows of N·C floats
// (885 KB at 6912 atoms), where 32 rows ahead was up to 28 MB of prefetches
// that evicted the rows in use; at 256 atoms (32 KB rows) they help.
constexpr int64_t kPrefetchMaxRowBytes = (int64_t{1} << 20) / kPrefetchEdges;

// Prefetches the cache lines of one row of K elements (rw: 1 to write).
template <class T>
CRUCIBLE_INLINE_IN_CLONES void prefetch_row(const T* row, int64_t K, int rw) {
  if (K * static_cast<int64_t>(sizeof(T)) > kPrefetchMaxRowBytes) return;
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < K * static_cast<int64_t>(sizeof(T)); b += 64) {
    if (rw) {
      __builtin_prefetch(p + b, 1, 3);
    } else {
      __builtin_prefetch(p + b, 0, 3);
    }
  }
}

// `pair` null: W row e for edge e; else W row pair[e] (one filter per pair).
// Sums in A (float for bfloat16 inputs, else T).
// Bitwise reproducible: `out` never overlaps the inputs (__restrict), so the
// compiler adds no run-time overlap test choosing between a vector and a
// scalar version of the row loop; those versions rounded differently (fused
// multiply-add in one, not in the other), so a result depended on where the
// allocator had placed the tensors (ExactResume failed ~1 run in 40). The
// file is also built without FMA contraction (CMakeLists.txt).
template <class T, class A>
CRUCIBLE_INLINE_IN_CLONES void cfconv_kernel(const T* __restrict h, const T* __restrict w, const int64_t* recv,
                                             const int64_t* send, const int64_t* pair, A* __restrict out, int64_t E,
                                             int64_t K) {
  for (int64_t e = 0; e < E; ++e) {
    if (e + kPrefetchEdges < E) {
      if (pair) prefetch_row(w + pair[e + kPrefetchEdges] * K, K, 0);
      prefetch_row(h + send[e + kPrefetchEdges] * K, K, 0);
    }
    A* __restrict o = out + recv[e] * K;
    const T* __restrict hs = h + send[e] * K;
    const T* __restrict we = w + (pair ? pair[e] : e) * K;
    for (int64_t k = 0; k < K; ++k) o[k] += widen(hs[k]) * widen(we[k]);
  }
}

// out row e = a[left e] ⊙ b[right e] (per pair: edge_product_grouped_kernel).
template <class T, class A>
CRUCIBLE_INLINE_IN_CLONES void edge_product_kernel(const T* __restrict a, const T* __restrict b, const int64_t* left,
                                                   const int64_t* right, A* __restrict out, int64_t E, int64_t K) {
  for (int64_t e = 0; e < E; ++e) {
    if (e + kPrefetchEdges < E) {
      prefetch_row(a + left[e + kPrefetchEdges] * K, K, 0);
      prefetch_row(b + right[e + kPrefetchEdges] * K, K, 0);
    }
    const T* __restrict al = a + left[e] * K;
    const T* __restrict br = b + right[e] * K;
    A* __restrict o = out + e * K;
    for (int64_t k = 0; k < K; ++k) o[k] = widen(al[k]) * widen(br[k]);
  }
}

constexpr int64_t kPrefetchPairs = kPrefetchEdges / 2;  // a pair is two edges, or one

// out row q = Σ a[left[e]] ⊙ b[right[e]] over the edges e of pair q
// (order[offsets[q] .. offsets[q+1]), increasing e), summed in A and
// stored once as T: no [P,K] accumulator to zero beforehand or round
// afterwards. The same additions in the same order as edge_product_kernel
// into a zeroed row (0 + x is exact), so the same bits.
template <class T, class A>
CRUCIBLE_INLINE_IN_CLONES void edge_product_grouped_kernel(const T* __restrict a, const T* __restrict b,
                                                           const int64_t* left, const int64_t* right,
                                                           const int64_t* offsets, const int64_t* order,
                                                           T* __restrict out, A* __restrict tmp, int64_t P, int64_t K) {
  for (int64_t q = 0; q < P; ++q) {
    T* __restrict o = out + q * K;
    const int64_t begin = offsets[q], end = offsets[q + 1];
    if (begin == end) {
      for (int64_t k = 0; k < K; ++k) o[k] = bf16_bits::narrow<T>(A(0));
      continue;
    }
    // The rows of the pair kPrefetchPairs ahead (~kPrefetchEdges edges).
    if (q + kPrefetchPairs < P) {
      for (int64_t x = offsets[q + kPrefetchPairs]; x < offsets[q + kPrefetchPairs + 1]; ++x) {
        prefetch_row(a + left[order[x]] * K, K, 0);
        prefetch_row(b + right[order[x]] * K, K, 0);
      }
    }
    const int64_t e0 = order[begin];
    const T* __restrict a0 = a + left[e0] * K;
    const T* __restrict b0 = b + right[e0] * K;
    for (int64_t k = 0; k < K; ++k) tmp[k] = widen(a0[k]) * widen(b0[k]);
    for (int64_t x = begin + 1; x < end; ++x) {
      const int64_t e = order[x];
      const T* __restrict al = a + left[e] * K;
      const T* __restrict br = b + right[e] * K;
      for (int64_t k = 0; k < K; ++k) tmp[k] += widen(al[k]) * widen(br[k]);
    }
    for (int64_t k = 0; k < K; ++k) o[k] = bf16_bits::narrow<T>(tmp[k]);
  }
}

// One instantiation per dtype, each built for AVX-512, AVX2 and the baseline
// (simd_clones.h) and picked at load time (the baseline
// build ran these loops 4 floats wide).
#define CRUCIBLE_CFCONV_INSTANCES(T, A, NAME)                                                                    \
  CRUCIBLE_SIMD_CLONES void cfconv_##NAME(const T* h, const T* w, const int64_t* recv, const int64_t* send,      \
                                            const int64_t* pair, A* out, int64_t E, int64_t K) {                 \
    cfconv_kernel<T, A>(h, w, recv, send, pair, out, E, K);                                                      \
  }                                                                                                              \
  CRUCIBLE_SIMD_CLONES void edge_product_##NAME(const T* a, const T* b, const int64_t* left,                     \
                                                  const int64_t* right, A* out, int64_t E, int64_t K) {          \
    edge_product_kernel<T, A>(a, b, left, right, out, E, K);                                                     \
  }                                                                                                              \
  CRUCIBLE_SIMD_CLONES void edge_product_grouped_##NAME(const T* a, const T* b, const int64_t* left,               \
                                                          const int64_t* right, const int64_t* offsets,            \
                                                          const int64_t* order, T* out, A* tmp, int64_t P,         \
                                                          int64_t K) {                                             \
    edge_product_grouped_kernel<T, A>(a, b, left, right, offsets, order, out, tmp, P, K);                          \
  }                                                                                                              \
  inline void cfconv_any(const T* h, const T* w, const int64_t* recv, const int64_t* send, const int64_t* pair,  \
                         A* out, int64_t E, int64_t K) {                                                         \
    cfconv_##NAME(h, w, recv, send, pair, out, E, K);                                                            \
  }                                                                                                              \
  inline void edge_product_grouped_any(const T* a, const T* b, const int64_t* left, const int64_t* right,         \
                                       const int64_t* offsets, const int64_t* order, T* out, A* tmp, int64_t P,   \
                                       int64_t K) {                                                              \
    edge_product_grouped_##NAME(a, b, left, right, offsets, order, out, tmp, P, K);                              \
  }                                                                                                              \
  inline void edge_product_any(const T* a, const T* b, const int64_t* left, const int64_t* right, A* out,         \
                               int64_t E, int64_t K) {                                                           \
    edge_product_##NAME(a, b, left, right, out, E, K);                                                           \
  }
CRUCIBLE_CFCONV_INSTANCES(float, float, f)
CRUCIBLE_CFCONV_INSTANCES(double, double, d)
CRUCIBLE_CFCONV_INSTANCES(c10::BFloat16, float, bf)
#undef CRUCIBLE_CFCONV_INSTANCES

// The sum's dtype: float for bfloat16 inputs (rounded once at the end), else the input's.
at::ScalarType sum_dtype(at::ScalarType t) { return t == at::kBFloat16 ? at::kFloat : t; }

// W has one row per edge (pair undefined) or per pair (W [P,K], pair [E]).
// out_rows: rows of the result (receivers index them); h's rows are the senders'.
at::Tensor cfconv_forward(const at::Tensor& h, const at::Tensor& W, const at::Tensor& recv,
                          const at::Tensor& send, const at::Tensor& pair, int64_t out_rows) {
  const int64_t E = recv.size(0);
  TORCH_CHECK(h.dim() == 2 && W.dim() == 2 && h.size(1) == W.size(1) && send.size(0) == E &&
                  (pair.defined() ? pair.size(0) == E : W.size(0) == E),
              "cfconv: h [N,K], W [E,K] (or [P,K] with edge_pair [E]), receiver/sender [E] expected");
  if (!fused_ok(h, W)) {
    const at::Tensor We = pair.defined() ? W.index_select(0, pair) : W;
    return at::zeros({out_rows, h.size(1)}, h.options()).index_add(0, recv, h.index_select(0, send) * We);
  }
  const at::Tensor hc = h.contiguous(), wc = W.contiguous();
  const at::Tensor r = recv.contiguous(), s = send.contiguous();
  check_indices(r, out_rows, "cfconv receiver");
  check_indices(s, h.size(0), "cfconv sender");
  const at::Tensor pc = pair.defined() ? pair.contiguous() : at::Tensor();
  if (pc.defined()) check_indices(pc, W.size(0), "cfconv edge_pair");
  at::Tensor out = at::zeros({out_rows, hc.size(1)}, hc.options().dtype(sum_dtype(hc.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, hc.scalar_type(), "cfconv", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    cfconv_any(hc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(), r.data_ptr<int64_t>(), s.data_ptr<int64_t>(),
               pc.defined() ? pc.data_ptr<int64_t>() : nullptr, out.data_ptr<acc_t>(), E, wc.size(1));
  });
  return out.to(hc.scalar_type());
}

// rows: E (pair undefined) or the number of pairs P.
at::Tensor edge_product_forward(const at::Tensor& a, const at::Tensor& b, const at::Tensor& left,
                                const at::Tensor& right, const at::Tensor& pair, int64_t rows) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1) &&
                  left.size(0) == right.size(0) && (!pair.defined() || pair.size(0) == left.size(0)),
              "edge_product: a, b [N,K], left/right [E] (and edge_pair [E]) expected");
  if (!fused_ok(a, b)) {
    const at::Tensor p = a.index_select(0, left) * b.index_select(0, right);
    return pair.defined() ? at::zeros({rows, a.size(1)}, p.options()).index_add(0, pair, p) : p;
  }
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const at::Tensor l = left.contiguous(), r = right.contiguous();
  check_indices(l, a.size(0), "edge_product left");
  check_indices(r, b.size(0), "edge_product right");
  const at::Tensor pc = pair.defined() ? pair.contiguous() : at::Tensor();
  if (pc.defined()) check_indices(pc, rows, "edge_product edge_pair");
  const int64_t K = ac.size(1);
  if (pc.defined()) {
    // Edges grouped by pair (stable), then one pass over the pairs.
    const KeyGroups groups = counting_sort(pc.data_ptr<int64_t>(), pc.size(0), rows);
    at::Tensor out = at::empty({rows, K}, ac.options());
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, ac.scalar_type(), "edge_product", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      std::vector<acc_t> tmp(static_cast<size_t>(K));
      edge_product_grouped_any(ac.data_ptr<scalar_t>(), bc.data_ptr<scalar_t>(), l.data_ptr<int64_t>(),
                               r.data_ptr<int64_t>(), groups.offsets.data(), groups.order.data(),
                               out.data_ptr<scalar_t>(), tmp.data(), rows, K);
    });
    return out;
  }
  const auto acc = ac.options().dtype(sum_dtype(ac.scalar_type()));
  at::Tensor out = at::empty({l.size(0), K}, acc);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, ac.scalar_type(), "edge_product", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    edge_product_any(ac.data_ptr<scalar_t>(), bc.data_ptr<scalar_t>(), l.data_ptr<int64_t>(), r.data_ptr<int64_t>(),
                     out.data_ptr<acc_t>(), l.size(0), K);
  });
  return out.to(ac.scalar_type());
}

struct EdgeProduct;

// Inputs h, W, receiver, sender, edge_pair. A custom Function's inputs must
// be defined tensors (LibTorch 1.13), so "one W row per edge" is an empty
// edge_pair with per_pair false.
at::Tensor pair_or_none(const at::Tensor& pair, bool per_pair) { return per_pair ? pair : at::Tensor(); }

struct Cfconv : public Function<Cfconv> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& W,
                            const at::Tensor& recv, const at::Tensor& send, const at::Tensor& pair,
                            bool per_pair, int64_t out_rows) {
    ctx->save_for_backward({h, W, recv, send, pair});
    ctx->saved_data["per_pair"] = per_pair;
    return cfconv_forward(h, W, recv, send, pair_or_none(pair, per_pair), out_rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

// Inputs a, b, left, right, edge_pair (per_pair false: one output row per edge), rows.
struct EdgeProduct : public Function<EdgeProduct> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& left, const at::Tensor& right, const at::Tensor& pair,
                            bool per_pair, int64_t rows) {
    ctx->save_for_backward({a, b, left, right, pair});
    ctx->saved_data["per_pair"] = per_pair;
    return edge_product_forward(a, b, left, right, pair_or_none(pair, per_pair), rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    const bool per_pair = ctx->saved_data["per_pair"].toBool();
    if (ctx->needs_input_grad(0)) ga = Cfconv::apply(s[1], g, s[2], s[3], s[4], per_pair, s[0].size(0));
    if (ctx->needs_input_grad(1)) gb = Cfconv::apply(s[0], g, s[3], s[2], s[4], per_pair, s[1].size(0));
    return {ga, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

variable_list Cfconv::backward(AutogradContext* ctx, variable_list grads) {
  const auto s = ctx->get_saved_variables();
  const at::Tensor& g = grads[0];
  at::Tensor gh, gW;
  const bool per_pair = ctx->saved_data["per_pair"].toBool();
  if (ctx->needs_input_grad(0)) gh = Cfconv::apply(g, s[1], s[3], s[2], s[4], per_pair, s[0].size(0));
  if (ctx->needs_input_grad(1)) gW = EdgeProduct::apply(g, s[0], s[2], s[3], s[4], per_pair, s[1].size(0));
  return {gh, gW, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
}

at::Tensor no_pairs() { return at::empty({0}, at::kLong); }

}  // namespace

at::Tensor cfconv(const at::Tensor& h, const at::Tensor& W, const at::Tensor& receiver,
                  const at::Tensor& sender) {
  const auto dtype = at::result_type(h, W);
  return Cfconv::apply(h.to(dtype), W.to(dtype), receiver, sender, no_pairs(), false, h.size(0));
}

at::Tensor cfconv_pairs(const at::Tensor& h, const at::Tensor& W_pairs, const at::Tensor& receiver,
                        const at::Tensor& sender, const at::Tensor& edge_pair) {
  TORCH_CHECK(edge_pair.defined(), "cfconv_pairs: edge_pair [E] int64 expected");
  const auto dtype = at::result_type(h, W_pairs);
  return Cfconv::apply(h.to(dtype), W_pairs.to(dtype), receiver, sender, edge_pair, true, h.size(0));
}

at::Tensor edge_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& left,
                        const at::Tensor& right) {
  const auto dtype = at::result_type(a, b);
  return EdgeProduct::apply(a.to(dtype), b.to(dtype), left, right, no_pairs(), false, left.size(0));
}

at::Tensor edge_product_pairs(const at::Tensor& a, const at::Tensor& b, const at::Tensor& left,
                              const at::Tensor& right, const at::Tensor& edge_pair, int64_t num_pairs) {
  TORCH_CHECK(edge_pair.defined() && num_pairs >= 0, "edge_product_pairs: edge_pair [E] and num_pairs >= 0 expected");
  const auto dtype = at::result_type(a, b);
  return EdgeProduct::apply(a.to(dtype), b.to(dtype), left, right, edge_pair, true, num_pairs);
}

namespace {

/// reverse[e]: the first edge (j, i, -S) of edge e = (i, j, S) in the order
/// of the groups (edges by source atom, offsets [n+1]; `order` empty = the
/// edges' own order), or e itself. `shift(k, c)` is edge k's integer shift
/// along c. Where the groups are the edges' own order and each one's
/// destinations ascend (`ascending`), the sources ascend too, so the place
/// of i among j's destinations only moves forward from one edge to the
/// next: a cursor per group walks there (each group walked once per
/// thread's range, O(E) in all) and the search ends after the last
/// destination i. The same edge as the scan, with one or two loads per
/// edge where a bisection made five or six dependent ones (27 -> ~10 ms
/// for the 10^6 edges of a 16384-atom SchNet KIM cluster, AMD EPYC VM with
/// avx512_bf16, the two builds alternating).
template <typename Shift>
void find_reverse(const int64_t* src, const int64_t* dst, int64_t E, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& order, bool ascending, const Shift& shift,
                  std::vector<int64_t>& reverse) {
  const bool identity = order.empty();
  if (identity && ascending) {
    const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
    const int64_t grain = std::max<int64_t>(4096, (E + threads - 1) / threads);
    at::parallel_for(0, E, grain, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> cursor(offsets.begin(), offsets.end() - 1);  // each group's first edge
      for (int64_t e = begin; e < end; ++e) {
        const int64_t j = dst[e], key = src[e];
        const int64_t last = offsets[static_cast<size_t>(j + 1)];
        int64_t q = cursor[static_cast<size_t>(j)];
        while (q < last && dst[q] < key) ++q;
        cursor[static_cast<size_t>(j)] = q;
        int64_t found = e;
        const int64_t s0 = shift(e, 0), s1 = shift(e, 1), s2 = shift(e, 2);
        for (; q < last && dst[q] == key; ++q) {
          if (q != e && shift(q, 0) == -s0 && shift(q, 1) == -s1 && shift(q, 2) == -s2) {
            found = q;
            break;
          }
        }
        reverse[static_cast<size_t>(e)] = found;
      }
    });
    return;
  }
  at::parallel_for(0, E, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      int64_t found = e;
      const int64_t s0 = shift(e, 0), s1 = shift(e, 1), s2 = shift(e, 2);
      for (int64_t q = offsets[static_cast<size_t>(dst[e])]; q < offsets[static_cast<size_t>(dst[e] + 1)]; ++q) {
        const int64_t k = identity ? q : order[static_cast<size_t>(q)];
        if (k != e && dst[k] == src[e] && shift(k, 0) == -s0 && shift(k, 1) == -s1 && shift(k, 2) == -s2) {
          found = k;
          break;
        }
      }
      reverse[static_cast<size_t>(e)] = found;
    }
  });
}

}  // namespace

std::pair<at::Tensor, at::Tensor> reverse_edge_pairs(const at::Tensor& edge_index,
                                                     const at::Tensor& shifts) {
  TORCH_CHECK(edge_index.dim() == 2 && edge_index.size(0) == 2 &&
                  (!shifts.defined() ||
                   (shifts.dim() == 2 && shifts.size(1) == 3 && shifts.size(0) == edge_index.size(1))),
              "reverse_edge_pairs: edge_index [2,E] and shifts [E,3] (or undefined: zero) expected");
  const at::Tensor ei = edge_index.to(at::kCPU, at::kLong).contiguous();
  const int64_t E = ei.size(1);
  const int64_t* src = ei.data_ptr<int64_t>();
  const int64_t* dst = src + E;
  int64_t n = 0;
  for (int64_t e = 0; e < 2 * E; ++e) {
    TORCH_CHECK(src[e] >= 0, "reverse_edge_pairs: edge_index must be >= 0, got ", src[e]);
    n = std::max(n, src[e] + 1);
  }
  // Edges grouped by source atom: the reverse of (i, j, S) is among j's
  // edges. Crucible's lists and the KIM cluster's come sorted by source,
  // each source's destinations ascending: the groups are then the edges'
  // own order, searched by a forward-only cursor (find_reverse).
  std::vector<int64_t> offsets, order;
  if (std::is_sorted(src, src + E)) {
    offsets.assign(static_cast<size_t>(n + 1), 0);
    for (int64_t e = 0; e < E; ++e) ++offsets[static_cast<size_t>(src[e] + 1)];
    for (int64_t a = 0; a < n; ++a) offsets[static_cast<size_t>(a + 1)] += offsets[static_cast<size_t>(a)];
  } else {
    KeyGroups by_source = counting_sort(src, E, n);
    offsets = std::move(by_source.offsets);
    order = std::move(by_source.order);
  }
  bool ascending = order.empty();  // each source's destinations ascending (the cursor search)
  for (int64_t e = 1; e < E && ascending; ++e) ascending = src[e] != src[e - 1] || dst[e] >= dst[e - 1];
  std::vector<int64_t> reverse(static_cast<size_t>(E));
  // Zero shifts (a cluster: KIM's, undefined, or its float edge-gradient
  // leaf) compare equal by construction; others as int64 (rounded where
  // they are floating point, as at::round: they are integer-valued).
  const at::Tensor sh = shifts.defined() ? shifts.detach().to(at::kCPU) : at::Tensor();
  if (sh.defined() && (!at::is_floating_point(sh) || sh.ne(0).any().item<bool>())) {
    const at::Tensor s64 =
        sh.scalar_type() == at::kLong ? sh.contiguous() : sh.to(at::kDouble).round().to(at::kLong).contiguous();
    const int64_t* s = s64.data_ptr<int64_t>();
    find_reverse(src, dst, E, offsets, order, ascending, [s](int64_t k, int c) { return s[3 * k + c]; }, reverse);
  } else {
    find_reverse(src, dst, E, offsets, order, ascending, [](int64_t, int) { return int64_t{0}; }, reverse);
  }
  // A pair is two edges that are each other's reverse (a duplicated edge
  // stays alone); its representative is its first edge, pairs numbered in
  // the order of their representatives.
  at::Tensor edge_pair = at::empty({E}, at::kLong);
  int64_t* ep = edge_pair.data_ptr<int64_t>();
  std::vector<int64_t> rep;
  rep.reserve(static_cast<size_t>(E / 2 + 1));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r = reverse[static_cast<size_t>(e)];
    if (r < e && reverse[static_cast<size_t>(r)] == e) {
      ep[e] = ep[r];
    } else {
      ep[e] = static_cast<int64_t>(rep.size());
      rep.push_back(e);
    }
  }
  at::Tensor representative = at::tensor(rep, at::kLong);
  return {edge_pair.to(edge_index.device()), representative.to(edge_index.device())};
}

}  // namespace crucible
