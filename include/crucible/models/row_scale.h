#pragma once
// Rows scaled by one factor each, and row-wise dot products: the pair of
// operations that SchNet's filter cutoff W = a · f_c(d) and its derivatives
// of every order are made of (issue 19). Each is one fused pass on the CPU,
// where a broadcast multiply and its generic derivative (a multiply, then a
// sum over the row) took ~6% of a SchNet training step in perf (AMD EPYC
// Zen 5 VM, float32 and bf16-mixed alike).

#include <ATen/ATen.h>

namespace crucible {

/// out[r, k] = a[r, k] · s[r]: a [R,K], s [R] → [R,K] in a's dtype (s is
/// cast to it). Equal to a * s.unsqueeze(-1), bit for bit in float32 and
/// float64 (one product per element; bfloat16 computed in float32 and
/// rounded once, as LibTorch's bfloat16 multiply rounds). Derivatives exact
/// to any order: ∂/∂a = scale_rows(g, s), ∂/∂s = row_dot(g, a).
/// Fused CPU loop for float32, float64 and bfloat16; LibTorch's ops on
/// other devices and dtypes.
/// @throws c10::Error unless a is 2-D and s is 1-D with a.size(0) rows, on a's device.
at::Tensor scale_rows(const at::Tensor& a, const at::Tensor& s);

/// out[r] = Σ_k a[r, k] · b[r, k]: a, b [R,K] of one dtype (b is cast to
/// a's) → [R] in that dtype; bfloat16 summed in float32 and rounded once.
/// The sum runs in 16 fixed lanes, so a result never depends on the
/// tensors' alignment or the ISA clone picked at load time. Derivatives:
/// ∂/∂a = scale_rows(b, g), ∂/∂b = scale_rows(a, g).
/// @throws c10::Error unless a and b are 2-D of one shape on one device.
at::Tensor row_dot(const at::Tensor& a, const at::Tensor& b);

}  // namespace crucible
