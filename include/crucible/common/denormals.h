#pragma once
// Flush-to-zero for float32/float64 denormals while Crucible computes.
//
// Denormals (|x| < 1.2e-38 in float32, < 2.2e-308 in float64) are computed by
// microcode on Intel x86 CPUs at ~100 cycles per operation. Radial bases and
// their derivatives produce them (a Gaussian exp(-γ(d-μ)²) between 87 and 103
// e-folds lies in float32's denormal range), and one denormal operand makes
// a whole GEMM tile slow. Measured (Intel Xeon with AVX-512, avx512_bf16 and
// AMX, 1 thread, 2026-12-05): a float32 SchNet training step took 28 ms with
// flush-to-zero against 80-87 ms without (sgemm 64% of the step), and SchNet
// inference 47 against 109 µs/atom; the MAEs after 100 steps were the same
// to the printed digits. AMD Zen 5 handles denormals in hardware at about
// full speed. PyTorch users get the same with torch.set_flush_denormal(True).
//
// On x86 the guard sets MXCSR's FTZ (bit 15: denormal results become ±0) and
// DAZ (bit 6: denormal inputs read as ±0) on the calling thread and on each
// of LibTorch's intra-op (OpenMP) threads, and restores the caller's previous
// setting on all of them when it ends, so a host process (Python, LAMMPS)
// gets its floating-point environment back after each call. Elsewhere it
// does nothing. Setting CRUCIBLE_KEEP_DENORMALS=1 in the environment turns
// every guard off (for comparisons against a run without the flush).
// Source for the bits: Intel 64 and IA-32 Architectures Software Developer's
// Manual, Vol. 1, §10.2.3 (MXCSR control/status register: flush-to-zero,
// denormals-are-zeros).

namespace crucible {

/// True where this build can flush denormals (x86 with SSE). Never throws.
bool denormal_flush_supported();

/// True if the calling thread flushes denormals now (MXCSR FTZ and DAZ both
/// set); false where denormal_flush_supported() is false. Never throws.
bool denormals_flushed_on_this_thread();

/// RAII: denormals flush to zero on the calling thread and the intra-op
/// threads while the guard lives (see the top of this file). Nested guards
/// are fine: an inner guard leaves the outer one's setting in place. Used by
/// compute_outputs, backward_into, evaluate_cluster and TrainingStrategy::run
/// / train_batch, so every path that computes energies, forces, a backward
/// or a training step flushes.
/// Never throws.
class DenormalFlushGuard {
 public:
  /// `enabled` false, CRUCIBLE_KEEP_DENORMALS=1 or an unsupported CPU: no-op.
  explicit DenormalFlushGuard(bool enabled = true);
  ~DenormalFlushGuard();
  DenormalFlushGuard(const DenormalFlushGuard&) = delete;
  DenormalFlushGuard& operator=(const DenormalFlushGuard&) = delete;

 private:
  bool active_ = false;          ///< this guard changed the setting
  bool previously_flushed_ = false;  ///< the caller's setting before the guard
};

}  // namespace crucible
