#pragma once
// OpenBLAS kernel choice on CPUs its autodetection does not know.

#include <string>

namespace crucible {

/// Debian 12's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels when the
/// library loads; on CPUs newer than it knows (measured: a Sapphire-Rapids-
/// class Xeon with AVX-512 and avx512_bf16) it falls back to "Prescott",
/// the SSE3 kernels: 21 GFLOP/s for a 1024³ fp32 GEMM on one core against
/// 125 GFLOP/s with "Cooperlake". The choice can only be made through the
/// OPENBLAS_CORETYPE environment variable before the library loads, so when
/// it is unset, the BLAS is OpenBLAS, its kernels are a generic fallback and
/// this CPU has AVX-512 (AVX2), this sets OPENBLAS_CORETYPE to Cooperlake
/// (avx512_bf16) / SkylakeX (AVX-512) / Haswell (AVX2) and re-executes the
/// program once (/proc/self/exe, same argv; CRUCIBLE_BLAS_REEXEC=1 marks the
/// second run). Call first in main(). Returns normally when nothing needs
/// doing or the re-exec fails (then the slow kernels stay). Never throws.
void select_blas_kernels(int argc, char** argv);

/// The OpenBLAS kernel name in use ("Cooperlake", "Haswell", "Zen", ...),
/// or "not OpenBLAS". Never throws.
std::string blas_core_name();

}  // namespace crucible
