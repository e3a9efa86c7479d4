#include "crucible/data/batch.h"

#include <stdexcept>

namespace crucible {

namespace {

at::Tensor maybe_to(const at::Tensor& t, at::Device device, at::ScalarType dtype) {
  if (!t.defined()) return t;
  if (at::isFloatingType(t.scalar_type())) return t.to(device, dtype);
  return t.to(device);
}

}  // namespace

Batch Batch::to(at::Device device, at::ScalarType dtype) const {
  Batch out;
  out.positions = maybe_to(positions, device, dtype);
  out.atomic_numbers = maybe_to(atomic_numbers, device, dtype);
  out.batch = maybe_to(batch, device, dtype);
  out.ptr = maybe_to(ptr, device, dtype);
  out.num_atoms = maybe_to(num_atoms, device, dtype);
  out.edge_index = maybe_to(edge_index, device, dtype);
  out.shifts = maybe_to(shifts, device, dtype);
  out.cell = maybe_to(cell, device, dtype);
  out.pbc = maybe_to(pbc, device, dtype);
  // Energy labels stay float64 whatever `dtype` (issue 48): the energy loss
  // takes its difference in float64.
  out.energy = maybe_to(energy, device, at::kDouble);
  out.forces = maybe_to(forces, device, dtype);
  out.stress = maybe_to(stress, device, dtype);
  out.has_energy = maybe_to(has_energy, device, dtype);
  out.has_forces = maybe_to(has_forces, device, dtype);
  out.has_stress = maybe_to(has_stress, device, dtype);
  out.weight = maybe_to(weight, device, dtype);
  out.energy_weight = maybe_to(energy_weight, device, dtype);
  out.forces_weight = maybe_to(forces_weight, device, dtype);
  out.stress_weight = maybe_to(stress_weight, device, dtype);
  out.config_types = config_types;
  out.layer_nodes = layer_nodes;
  return out;
}

Batch collate(const std::vector<const Structure*>& structures,
              const std::vector<const NeighborList*>& neighbor_lists) {
  if (structures.empty()) {
    throw std::invalid_argument("collate: structures must be non-empty, got 0 structures");
  }
  if (structures.size() != neighbor_lists.size()) {
    throw std::invalid_argument("collate: neighbor_lists must have one entry per structure (" +
                                std::to_string(structures.size()) + "), got " +
                                std::to_string(neighbor_lists.size()));
  }
  const auto B = static_cast<int64_t>(structures.size());
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const auto i64 = at::TensorOptions().dtype(at::kLong);

  std::vector<at::Tensor> pos, z, graph, edges, shifts, cells, forces;
  at::Tensor pbc = at::zeros({B, 3}, at::TensorOptions().dtype(at::kBool));
  at::Tensor num_atoms = at::empty({B}, i64);
  at::Tensor ptr = at::empty({B + 1}, i64);
  at::Tensor energy = at::zeros({B}, f64);
  at::Tensor stress = at::zeros({B, 3, 3}, f64);
  at::Tensor has_energy = at::zeros({B}, at::TensorOptions().dtype(at::kBool));
  at::Tensor has_forces = at::zeros_like(has_energy);
  at::Tensor has_stress = at::zeros_like(has_energy);
  at::Tensor weight = at::empty({B}, f64), energy_weight = at::empty({B}, f64);
  at::Tensor forces_weight = at::empty({B}, f64), stress_weight = at::empty({B}, f64);
  Batch out;
  out.config_types.reserve(B);

  auto pbc_a = pbc.accessor<bool, 2>();
  auto n_a = num_atoms.accessor<int64_t, 1>();
  auto ptr_a = ptr.accessor<int64_t, 1>();
  auto e_a = energy.accessor<double, 1>();
  auto he_a = has_energy.accessor<bool, 1>();
  auto hf_a = has_forces.accessor<bool, 1>();
  auto hs_a = has_stress.accessor<bool, 1>();
  auto w_a = weight.accessor<double, 1>();
  auto ew_a = energy_weight.accessor<double, 1>();
  auto fw_a = forces_weight.accessor<double, 1>();
  auto sw_a = stress_weight.accessor<double, 1>();

  int64_t offset = 0;
  ptr_a[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Structure& s = *structures[b];
    const NeighborList& nl = *neighbor_lists[b];
    const int64_t n = s.num_atoms();
    pos.push_back(s.positions.to(at::kDouble));
    z.push_back(s.atomic_numbers.to(at::kLong));
    graph.push_back(at::full({n}, b, i64));
    edges.push_back(nl.edge_index + offset);
    shifts.push_back(nl.shifts.to(at::kDouble));
    cells.push_back(s.cell.defined() ? s.cell.to(at::kDouble).reshape({1, 3, 3})
                                     : at::zeros({1, 3, 3}, f64));
    for (int d = 0; d < 3; ++d) pbc_a[b][d] = s.pbc[d];
    n_a[b] = n;
    offset += n;
    ptr_a[b + 1] = offset;
    if (s.energy) {
      e_a[b] = *s.energy;
      he_a[b] = true;
    }
    if (s.forces) {
      forces.push_back(s.forces->to(at::kDouble));
      hf_a[b] = true;
    } else {
      forces.push_back(at::zeros({n, 3}, f64));
    }
    if (s.stress) {
      stress[b].copy_(s.stress->to(at::kDouble).reshape({3, 3}));
      hs_a[b] = true;
    }
    w_a[b] = s.weight;
    ew_a[b] = s.energy_weight;
    fw_a[b] = s.forces_weight;
    sw_a[b] = s.stress_weight;
    out.config_types.push_back(s.config_type);
  }
  out.positions = at::cat(pos, 0);
  out.atomic_numbers = at::cat(z, 0);
  out.batch = at::cat(graph, 0);
  out.ptr = ptr;
  out.num_atoms = num_atoms;
  out.edge_index = at::cat(edges, 1);
  out.shifts = at::cat(shifts, 0);
  out.cell = at::cat(cells, 0);
  out.pbc = pbc;
  out.energy = energy;
  out.forces = at::cat(forces, 0);
  out.stress = stress;
  out.has_energy = has_energy;
  out.has_forces = has_forces;
  out.has_stress = has_stress;
  out.weight = weight;
  out.energy_weight = energy_weight;
  out.forces_weight = forces_weight;
  out.stress_weight = stress_weight;
  return out;
}

}  // namespace crucible
