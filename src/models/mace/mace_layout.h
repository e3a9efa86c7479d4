#pragma once
// Internal to the MACE import and export (issue 46): how each tensor of
// MACE's ScaleShiftMACE state_dict corresponds to Crucible's MACE tensors,
// in both directions, in one place (docs/mace_import.md tables them).
// e3nn's layouts: o3/_linear.py (a [mul_in, mul_out] block per instruction,
// instructions by input then output irrep), o3/_tensor_product (uvw blocks
// [mul1, mul2, mul_out]); MACE's modules/irreps_tools.py
// tp_out_irreps_with_instructions (the edge product's outputs sorted by
// irrep, stably, which orders the radial MLP's output columns).

#include "crucible/models/mace/mace.h"

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace crucible::mace_layout {

/// One MACE tensor and the Crucible tensors it holds.
struct TensorMap {
  std::string mace;                   ///< MACE state_dict name
  std::vector<int64_t> mace_shape;    ///< its shape in MACE
  std::vector<std::string> crucible;  ///< Crucible parameter / buffer names
  /// MACE tensor (reshaped to mace_shape) → Crucible tensors (same order as `crucible`).
  std::function<std::vector<at::Tensor>(const at::Tensor&)> to_crucible;
  /// Crucible tensors → the MACE tensor (mace_shape).
  std::function<at::Tensor(const std::vector<at::Tensor>&)> to_mace;
};

/// Every weight, U matrix and Clebsch-Gordan block of a `basis: mace` model
/// with options `o` (MaceOptions::u_columns gives the U shapes). The
/// radial constants, E0s, scale / shift and MACE's bookkeeping buffers are
/// handled by the import and export themselves.
std::vector<TensorMap> tensor_maps(const MaceOptions& o);

/// The per-layer irreps as MaceImpl builds them (per channel).
struct LayerIrreps {
  std::vector<mace::Irrep> node, target, out;
};
LayerIrreps layer_irreps(const MaceOptions& o, int64_t t);

/// Number of edge tensor-product paths of layer t and the message rows
/// (Σ over paths of 2 l3 + 1).
std::pair<int64_t, int64_t> tp_paths(const MaceOptions& o, int64_t t);

}  // namespace crucible::mace_layout
