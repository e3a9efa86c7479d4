// ZBL pair repulsion. See include/crucible/models/zbl.h.

#include "crucible/models/zbl.h"

#include "crucible/models/mace/radial.h"

#include <vector>

namespace crucible {

namespace {
/// Covalent radii (Å) by atomic number 0..118: Cordero et al., Dalton Trans.
/// 2008, 2832, as ase.data.covalent_radii (MACE's ZBL reads that table).
const std::vector<double> kCovalentRadii = {
    0.2, 0.31, 0.28, 1.28, 0.96, 0.84, 0.76, 0.71, 0.66, 0.57,
    0.58, 1.66, 1.41, 1.21, 1.11, 1.07, 1.05, 1.02, 1.06, 2.03,
    1.76, 1.7, 1.6, 1.53, 1.39, 1.39, 1.32, 1.26, 1.24, 1.32,
    1.22, 1.22, 1.2, 1.19, 1.2, 1.2, 1.16, 2.2, 1.95, 1.9,
    1.75, 1.64, 1.54, 1.47, 1.46, 1.42, 1.39, 1.45, 1.44, 1.42,
    1.39, 1.39, 1.38, 1.39, 1.4, 2.44, 2.15, 2.07, 2.04, 2.03,
    2.01, 1.99, 1.98, 1.98, 1.96, 1.94, 1.92, 1.92, 1.89, 1.9,
    1.87, 1.87, 1.75, 1.7, 1.62, 1.51, 1.44, 1.41, 1.36, 1.36,
    1.32, 1.45, 1.46, 1.48, 1.4, 1.5, 1.5, 2.6, 2.21, 2.15,
    2.06, 2.0, 1.96, 1.9, 1.87, 1.8, 1.69, 0.2, 0.2, 0.2,
    0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2,
    0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2,
};
}  // namespace

ZblParameters default_zbl_parameters(int64_t envelope_p) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  ZblParameters z;
  z.c = at::tensor(std::vector<double>{0.1818, 0.5099, 0.2802, 0.02817}, f64);
  z.a_exp = at::full({}, 0.300, f64);
  z.a_prefactor = at::full({}, 0.4543, f64);
  z.covalent_radii = at::tensor(kCovalentRadii, f64);
  z.envelope_p = envelope_p;
  return z;
}

at::Tensor zbl_node_energies(const at::Tensor& r, const at::Tensor& atomic_numbers, const at::Tensor& edge_index,
                             int64_t num_nodes, const ZblParameters& zbl) {
  TORCH_CHECK(r.dim() == 1 && edge_index.dim() == 2 && edge_index.size(0) == 2 && edge_index.size(1) == r.size(0),
              "zbl_node_energies: r [E] and edge_index [2,E] expected");
  const at::Tensor receiver = edge_index.select(0, 0), sender = edge_index.select(0, 1);
  const auto opt = r.options();
  const at::Tensor z = atomic_numbers.to(r.device(), at::kLong);
  const at::Tensor zu = z.index_select(0, sender), zv = z.index_select(0, receiver);
  const at::Tensor a_exp = zbl.a_exp.to(opt), c = zbl.c.to(opt);
  const at::Tensor zu_f = zu.to(opt.dtype()), zv_f = zv.to(opt.dtype());
  const at::Tensor a = zbl.a_prefactor.to(opt) * 0.529 / (at::pow(zu_f, a_exp) + at::pow(zv_f, a_exp));
  const at::Tensor x = r / a;
  const at::Tensor phi = c[0] * at::exp(-3.2 * x) + c[1] * at::exp(-0.9423 * x) + c[2] * at::exp(-0.4028 * x) +
                         c[3] * at::exp(-0.2016 * x);
  at::Tensor v = (14.3996 * zu_f * zv_f) / r * phi;
  const at::Tensor radii = zbl.covalent_radii.to(opt);
  const at::Tensor r_max = radii.index_select(0, zu) + radii.index_select(0, zv);
  v = 0.5 * v * mace::polynomial_envelope(r / r_max, zbl.envelope_p);
  return at::zeros({num_nodes}, opt).index_add(0, receiver, v);
}

}  // namespace crucible
