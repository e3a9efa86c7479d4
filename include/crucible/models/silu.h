#pragma once
// SiLU with hand-written first and second derivatives (issue 19): the
// activation of MACE's radial and readout MLPs, which force training
// differentiates twice.

#include <ATen/ATen.h>

#include <utility>

namespace crucible {

/// silu(x) = x σ(x) with autograd support (Elfwing, Uchibe and Doya,
/// Neural Networks 107, 3 (2018); Hendrycks and Gimpel's SiLU),
/// element-wise; any shape, float dtypes, any device, same shape and dtype
/// as x. Derivatives written out:
/// silu'(x) = σ(x)(1 + x(1 − σ(x))),
/// silu''(x) = σ(x)(1 − σ(x))(2 + x(1 − 2σ(x))),
/// each from x by one pass on the CPU (float32, float64, bfloat16; bfloat16
/// computed in float32 and rounded once), with one exponential e^−|x| per
/// element and σ(x) = 1/(1 + e^−|x|) for x ≥ 0, e^−|x|/(1 + e^−|x|) below.
/// ATen's bfloat16 silu converts element by element and ran 3.5× slower
/// than its float32 one ([5600, 64], AMD EPYC Zen 5 with avx512_bf16,
/// 1 thread, side by side: 596 against 171 µs).
/// Elsewhere (other devices or dtypes) at::silu and autograd. Derivatives
/// of any order: the first two (forces and their parameter gradients) by
/// the loops, higher ones (a backward with create_graph through the first
/// derivative) through ATen ops. Never throws for valid tensors.
at::Tensor silu_fused(const at::Tensor& x);

/// {silu(x), silu'(x)} without an autograd graph (the results never require
/// grad), as silu_fused computes them: for tests and benchmarks. Never throws
/// for valid tensors.
std::pair<at::Tensor, at::Tensor> silu_and_derivative(const at::Tensor& x);

}  // namespace crucible
