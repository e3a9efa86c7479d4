#pragma once
// CRUCIBLE_SIMD_CLONES: one build of a hot loop per x86 ISA level, picked
// at load time by GCC's target_clones (an ifunc resolver, glibc). Machines
// of one kind differ (Zen 3: AVX2 only; Zen 4/5: AVX-512), so the library
// itself is built for the baseline and only these loops get wider code.
// Internal to src/.
//
// The AVX-512 clone is "arch=x86-64-v4" (AVX-512 F, BW, CD, DQ, VL), not
// "avx512f" alone: without BW/VL, GCC narrows 32-bit lanes to 16 bits with
// packs and permutes on 256-bit vectors, and a bfloat16 loop that rounds
// float → bf16 (bf16_bits::narrow) ran 2.3x slower (60 against 26 µs for a
// [5632,64] row scale, AMD EPYC Zen 5, g++ 12.2 -O3).
//
// x86-64-v4 includes FMA (AVX-512F alone has it for 512-bit vectors), the
// "avx2" clone and the baseline do not: every file whose cloned loops do
// floating-point arithmetic is built with -ffp-contract=off (CMakeLists.txt),
// so a*b+c rounds a*b first in every clone, in vector bodies and scalar
// remainders alike, and results do not depend on the machine's ISA. (Before
// this header, silu.cpp and edge_contraction.cpp had no such flag: their
// "avx512f" clones fused 512-bit multiply-adds, 36 and 220 vfmadd, while
// their remainders did not.)

#if defined(__x86_64__) && defined(__GLIBC__)
#define CRUCIBLE_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CRUCIBLE_SIMD_CLONES
#endif

// For every helper a CRUCIBLE_SIMD_CLONES function calls with a loop in it:
// a helper GCC leaves out of line is built once, for the baseline ISA (SSE2,
// 4 floats wide), and every clone calls that copy. Found in perf: SchNet's
// edge_product_grouped_kernel (6-7.7% of a bf16-mixed step, 4% of a 32-true
// one) and MACE's edge loops at 64 and 128 channels had been running so.
#define CRUCIBLE_INLINE_IN_CLONES __attribute__((always_inline)) inline
