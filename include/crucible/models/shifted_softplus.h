#pragma once
// Shifted softplus with hand-written first and second derivatives (issue 7):
// the activation of SchNet's filter network and atom-wise layers, where force
// training differentiates it twice.

#include <ATen/ATen.h>

#include <utility>

namespace crucible {

/// ssp(x) = ln(½eˣ + ½) = softplus(x) − ln 2 (Schütt et al., J. Chem. Phys.
/// 148, 241722 (2018), Eq. 4), element-wise; any shape, float dtypes, any
/// device. Derivatives are written out instead of differentiating
/// softplus_backward generically: ssp'(x) = σ(x), ssp''(x) = σ(x)(1 − σ(x)),
/// with σ computed by the forward's one pass and saved. Correct up to second
/// order (what force training needs: forces and their parameter gradients);
/// a third derivative through it is not supported. Never throws for valid
/// tensors.
at::Tensor shifted_softplus(const at::Tensor& x);

/// {ssp(x), σ(x)} without an autograd graph (the results never require
/// grad): any shape, float32 / float64 / bfloat16, same shape and dtype as x.
/// On the CPU one pass over x with one exponential per element,
/// ssp(x) = max(x, 0) + ln(1 + e^−|x|) − ln 2, σ(x) = 1/(1 + e^−|x|) for
/// x ≥ 0 and e^−|x|/(1 + e^−|x|) below (bfloat16 computed in float32 and
/// rounded once); exact to a few float ulps and, unlike at::softplus, with
/// no switch to the identity above x = 20. Elsewhere at::softplus and
/// at::sigmoid. NaN and ±inf propagate. Never throws for valid tensors.
std::pair<at::Tensor, at::Tensor> shifted_softplus_and_sigmoid(const at::Tensor& x);

/// The same function through at::softplus and autograd's generic
/// derivatives: the reference the fast path is tested against.
at::Tensor shifted_softplus_reference(const at::Tensor& x);

}  // namespace crucible
