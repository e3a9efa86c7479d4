#pragma once
// Whether this CPU multiplies bf16 natively (issue 19, deliverable 3): on
// CPUs without avx512_bf16 / amx_bf16 LibTorch emulates bf16 matrix products
// (measured ~3.6 GFLOP/s on Zen 3 against ~100 fp32), and bf16-mixed is then
// slower than 32-true.

#include <optional>
#include <string>

namespace crucible {

/// True if the /proc/cpuinfo `flags` text lists avx512_bf16 or amx_bf16.
/// Never throws.
bool cpu_flags_have_native_bf16(const std::string& flags);

/// The `flags` line of /proc/cpuinfo ("" if unreadable). Never throws.
std::string read_cpu_flags();

/// Seconds per 256x256x256 matrix product in fp32 and in bf16 on the CPU
/// (best of 3 after a warm-up; ~10 ms where bf16 is emulated).
/// @throws c10::Error only if LibTorch cannot run the products.
std::pair<double, double> measure_cpu_matmul_fp32_bf16();

/// The start-up line for a bf16 precision mode on the CPU: "" when the CPU
/// has native bf16 (`flags`), else "this CPU has no native bf16
/// (avx512_bf16 / amx_bf16 missing from /proc/cpuinfo): a bf16 matrix
/// product measured 27.8x slower than fp32 here; 32-true is likely faster".
/// Never throws.
std::string cpu_bf16_note(const std::string& flags, double fp32_seconds, double bf16_seconds);

}  // namespace crucible
