#pragma once
// Edge lengths with a one-pass backward for the inference path (issue 48).

#include <ATen/ATen.h>

namespace crucible {

/// d_e = |v_e| = sqrt(v_e · v_e): v [E,3] (Å) → d [E], v's dtype.
///
/// On the CPU in float32 / float64 one loop forward, and one loop backward:
/// ∂L/∂v_e = (∂L/∂d_e / d_e) v_e (0 where d_e = 0). Autograd's
/// v.pow(2).sum(-1).sqrt() makes five passes over [E,3] in its backward,
/// one of them a product with the sum's expanded gradient: 7.5% of a
/// 16384-atom SchNet float32 step in LAMMPS (AMD EPYC VM with avx512_bf16).
/// First order only: the backward refuses a differentiable backward
/// (create_graph), which is the training path's; models call this on the
/// inference path only. Elsewhere (other devices or dtypes) the autograd
/// expression itself.
/// @throws c10::Error if v is not [E,3];
/// @throws std::runtime_error from the backward if create_graph is asked.
at::Tensor edge_lengths(const at::Tensor& v);

}  // namespace crucible
