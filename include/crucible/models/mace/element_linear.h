#pragma once
// MACE's element-dependent linear map (the skip connection's
// FullyConnectedTensorProduct with one-hot node attributes).

#include <ATen/ATen.h>

namespace crucible::mace {

/// y[n] = x[n] · W[elem[n]] / √(C · n_elem) for one irrep term: e3nn's
/// FullyConnectedTensorProduct of the features with the one-hot element
/// attributes, as MACE's skip_tp (Batatia et al., NeurIPS 2022; MACE's
/// modules/blocks.py).
///
/// x [N, d, C] features (d = 2l + 1 components), W [n_elem, C, C'], elem
/// [N] int64 element indices in [0, n_elem), one dtype and device for x
/// and W. Returns [N, d, C'], differentiable in x and W.
/// - one element in the model: one GEMM;
/// - up to 8: one GEMM for all of them and a gather;
/// - more (a foundation model's 89): the nodes grouped by element, one GEMM
///   per element present (a structure holds a few of them). A batched
///   product over nodes ran 2048 tiny GEMMs and gathered an [N, C, C']
///   weight copy: 45% of an 89-element MACE's inference call (issue 48).
/// Out-of-range indices are not checked here (MaceImpl::element_index
/// validates them). Never throws for valid shapes.
at::Tensor element_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& elem);

/// element_linear(x · A, W, elem) with the two maps merged per element
/// present: y[n] = x[n] · (A · W[elem[n]]) / √(C · n_elem) (issue 48, the
/// engine's merged linear maps: MACE's first-layer linear followed by its
/// skip_tp). x [N, d, K], A [K, C], W [n_elem, C, C'] (one floating dtype
/// and device), elem [N] int64 in [0, n_elem) → [N, d, C']; the
/// product over the nodes' C channels is saved (2 N d C C' FLOPs, and as
/// many again in the reverse pass) for K C C' per element present. Always
/// groups the nodes by element on the CPU (one GEMM per element present).
/// Differentiable in x, A and W. Never throws for valid shapes.
at::Tensor element_linear_after(const at::Tensor& x, const at::Tensor& A, const at::Tensor& W,
                                const at::Tensor& elem);

}  // namespace crucible::mace
