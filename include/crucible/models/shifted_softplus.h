#pragma once
// Shifted softplus with hand-written first and second derivatives (issue 7):
// the activation of SchNet's filter network and atom-wise layers, where force
// training differentiates it twice.

#include <ATen/ATen.h>

namespace crucible {

/// ssp(x) = ln(½eˣ + ½) = softplus(x) − ln 2 (Schütt et al., J. Chem. Phys.
/// 148, 241722 (2018), Eq. 4), element-wise; any shape, float dtypes, any
/// device. Derivatives are written out instead of differentiating
/// softplus_backward generically: ssp'(x) = σ(x), ssp''(x) = σ(x)(1 − σ(x)),
/// with σ saved from the first backward. Correct up to second order (what
/// force training needs: forces and their parameter gradients); a third
/// derivative through it is not supported. Never throws for valid tensors.
at::Tensor shifted_softplus(const at::Tensor& x);

/// The same function through at::softplus and autograd's generic
/// derivatives: the reference the fast path is tested against.
at::Tensor shifted_softplus_reference(const at::Tensor& x);

}  // namespace crucible
