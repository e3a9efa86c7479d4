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

}  // namespace crucible::mace
