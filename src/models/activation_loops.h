#pragma once
// Shared pieces of the one-pass activation loops (schnet/shifted_softplus.cpp,
// silu.cpp). Internal to src/models.
//
// The loops call exp/log, which GCC turns into glibc's vector variants
// (libmvec: 16 floats per call on AVX-512) only when they cannot set errno
// or raise FP exceptions: the files that include this header are built with
// -fno-math-errno -fno-trapping-math (CMakeLists.txt). NaN and ±inf still
// propagate as in IEEE arithmetic (no -ffinite-math-only).

#include "bf16_bits.h"
#include "../simd_clones.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && defined(__GLIBC__)
// The declarations <math.h> makes only under -ffast-math: glibc ships these
// vector variants (libmvec, glibc >= 2.22) for SSE, AVX2 and AVX-512.
extern "C" {
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
__attribute__((simd("notinbranch"))) double exp(double) noexcept;
__attribute__((simd("notinbranch"))) double log(double) noexcept;
}
#endif

namespace crucible::activation_loops {

inline float exp_of(float v) { return expf(v); }
inline double exp_of(double v) { return exp(v); }
inline float log_of(float v) { return logf(v); }
inline double log_of(double v) { return log(v); }

/// The compute type of a loop's elements, from its pointer array `In`
/// (const float* / const double* entries): float or double.
template <class In>
using element_of = std::remove_cv_t<std::remove_pointer_t<std::decay_t<decltype(std::declval<const In&>()[0])>>>;

/// σ(v) from e = e^−|v| ∈ (0, 1]: 1/(1+e) for v ≥ 0, e/(1+e) below (no
/// overflow for any v).
template <class A>
inline A sigmoid_of(A v, A e) {
  const A r = A(1) / (A(1) + e);
  return v >= A(0) ? r : e * r;
}

/// Runs f(k0, k1) over [0, n) in parallel, in ranges that start at
/// multiples of 1024 elements whatever the thread count: the loops' scalar
/// remainders (glibc's scalar expf, not its vector variant) then fall on the
/// same elements, so results do not depend on the threads.
template <class F>
void for_aligned_ranges(int64_t n, const F& f) {
  constexpr int64_t kAlign = 1024, kGrainBlocks = 32;  // at least 32768 elements per task
  const int64_t blocks = (n + kAlign - 1) / kAlign;
  at::parallel_for(0, blocks, kGrainBlocks, [&](int64_t b0, int64_t b1) {
    f(b0 * kAlign, std::min(n, b1 * kAlign));
  });
}

/// Whether the loops cover t: a CPU tensor of float32, float64 or bfloat16.
inline bool loop_ok(const at::Tensor& t) {
  return t.device().is_cpu() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble || t.scalar_type() == at::kBFloat16);
}

/// Whether a loop can take a together with b: a loop_ok, b on the CPU with
/// a's dtype and shape.
inline bool loop_ok_with(const at::Tensor& a, const at::Tensor& b) {
  return loop_ok(a) && b.device().is_cpu() && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes();
}

/// NO new tensors shaped like inputs[0] from NI inputs of one shape and
/// dtype, all loop_ok (the caller checks): call(in, out, m) on each of
/// for_aligned_ranges' ranges, in / out the range's scalar_t pointers
/// (arrays of NI and NO).
template <int NO, int NI, class Call>
std::array<at::Tensor, NO> map_elements(const std::array<at::Tensor, NI>& inputs, const Call& call) {
  std::array<at::Tensor, NI> in;
  for (int i = 0; i < NI; ++i) in[i] = inputs[i].contiguous();
  std::array<at::Tensor, NO> out;
  for (int o = 0; o < NO; ++o) out[o] = at::empty_like(in[0]);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, in[0].scalar_type(), "activation_loop", [&] {
    for_aligned_ranges(in[0].numel(), [&](int64_t k0, int64_t k1) {
      const scalar_t* pin[NI];
      scalar_t* pout[NO];
      for (int i = 0; i < NI; ++i) pin[i] = in[i].template data_ptr<scalar_t>() + k0;
      for (int o = 0; o < NO; ++o) pout[o] = out[o].template data_ptr<scalar_t>() + k0;
      call(pin, pout, k1 - k0);
    });
  });
  return out;
}

/// loop(in, out, m) over n elements of T with NI inputs and NO outputs.
/// float / double: called once on the arrays themselves. bfloat16: in
/// blocks of 256 widened to float32, the float loop, outputs rounded once;
/// a loop on bfloat16 directly mixed the conversions into the exp/log code
/// and ran at half width (452 µs against 189 µs in float32 for [5888, 64],
/// bench_activations). Always inlined: called from a target_clones
/// function, a separate copy would be built for the baseline ISA only.
template <class T, int NI, int NO, class FloatLoop>
__attribute__((always_inline)) inline void in_float_blocks(const T* const (&in)[NI], T* const (&out)[NO], int64_t n,
                                                          const FloatLoop& loop) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    constexpr int64_t kBlock = 256;
    alignas(64) float fin[NI][kBlock], fout[NO][kBlock];
    const float* pin[NI];  // the loop is generic over its pointer arrays
    float* pout[NO];
    for (int i = 0; i < NI; ++i) pin[i] = fin[i];
    for (int o = 0; o < NO; ++o) pout[o] = fout[o];
    for (int64_t k0 = 0; k0 < n; k0 += kBlock) {
      const int64_t m = std::min(kBlock, n - k0);
      for (int i = 0; i < NI; ++i) {
#pragma omp simd
        for (int64_t k = 0; k < m; ++k) fin[i][k] = bf16_bits::widen(in[i][k0 + k]);
      }
      loop(pin, pout, m);
      for (int o = 0; o < NO; ++o) {
#pragma omp simd
        for (int64_t k = 0; k < m; ++k) out[o][k0 + k] = bf16_bits::narrow<T, float>(fout[o][k]);
      }
    }
  } else {
    loop(in, out, n);
  }
}

}  // namespace crucible::activation_loops
