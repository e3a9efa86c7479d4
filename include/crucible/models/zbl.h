#pragma once
// The ZBL screened nuclear repulsion as a per-atom energy term, for models
// that must survive close encounters in MD (issue 48, item 3). The form and
// constants are those of MACE's `pair_repulsion` (mace/modules/radial.py,
// ZBLBasis), so that imported and trained models share one code.

#include <ATen/ATen.h>

#include <cstdint>

namespace crucible {

/// The constants of the ZBL term, as buffers a model registers (float64 or
/// the model's dtype; an imported MACE model holds its file's values).
struct ZblParameters {
  at::Tensor c;               ///< [4] amplitudes of the screening function φ.
  at::Tensor a_exp;           ///< [] exponent of Z in the screening length.
  at::Tensor a_prefactor;     ///< [] prefactor of the screening length (× 0.529 Å).
  at::Tensor covalent_radii;  ///< [119] Å, index Z.
  int64_t envelope_p = 5;     ///< exponent p of the polynomial envelope.
};

/// MACE's defaults: c = (0.1818, 0.5099, 0.2802, 0.02817), a_exp = 0.300,
/// a_prefactor = 0.4543 (the ZBL universal screening function, Ziegler,
/// Biersack & Littmark, The Stopping and Range of Ions in Solids, Pergamon
/// 1985, with MACE's screening length), covalent radii of Cordero et al.,
/// Dalton Trans. 2008, 2832 (ase.data.covalent_radii; 0.2 Å where none is
/// known); float64. Never throws.
ZblParameters default_zbl_parameters(int64_t envelope_p);

/// Per-atom ZBL energies [num_nodes] (eV, r's dtype and device):
///   V_i = ½ Σ_{e: receiver(e) = i} V(r_e) · f(r_e / (R_i + R_j)),
///   V(r) = 14.3996 eV·Å · Z_i Z_j / r · φ(r / a),
///   φ(x) = Σ_k c_k e^{−b_k x}, b = (3.2, 0.9423, 0.4028, 0.2016),
///   a = a_prefactor · 0.529 Å / (Z_i^a_exp + Z_j^a_exp),
/// f the polynomial envelope of order p (mace::polynomial_envelope), R the
/// covalent radii; both directions of a pair are edges, hence ½.
/// r [E] distances (Å), atomic_numbers [num_nodes] int64, edge_index [2,E]
/// int64 (row 0 receiver). Differentiable in r.
/// @throws c10::Error on mismatched shapes.
at::Tensor zbl_node_energies(const at::Tensor& r, const at::Tensor& atomic_numbers, const at::Tensor& edge_index,
                             int64_t num_nodes, const ZblParameters& zbl);

}  // namespace crucible
