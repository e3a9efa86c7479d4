// Energy, forces and virials of a partly contributing cluster (issue 17).

#include "crucible/deploy/cluster.h"

#include "crucible/data/batch.h"
#include "crucible/data/structure_checks.h"
#include "crucible/neighbors/neighbor_list.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace crucible {

namespace {

/// The closest pair among the edges (edge vectors `vec` [E,3]), refused if
/// closer than `min_distance`.
void check_min_distance(const at::Tensor& vec, const NeighborList& nl, double min_distance) {
  if (nl.num_edges() == 0) return;
  const at::Tensor i = nl.edge_index[0], j = nl.edge_index[1];
  const at::Tensor d = vec.norm(2, 1);
  const int64_t e = d.argmin().item<int64_t>();
  const double dmin = d[e].item<double>();
  if (dmin < min_distance) {
    throw std::invalid_argument("atoms " + std::to_string(i[e].item<int64_t>()) + " and " +
                                std::to_string(j[e].item<int64_t>()) + " are " + std::to_string(dmin) +
                                " Å apart, closer than the model's minimum distance " + std::to_string(min_distance) +
                                " Å (model.json min_distance_angstrom)");
  }
}

/// [E,6] Voigt (xx yy zz yz xz xy) of the symmetric part of [E,3,3].
at::Tensor voigt(const at::Tensor& m) {
  return at::stack({m.select(1, 0).select(1, 0), m.select(1, 1).select(1, 1), m.select(1, 2).select(1, 2),
                    0.5 * (m.select(1, 1).select(1, 2) + m.select(1, 2).select(1, 1)),
                    0.5 * (m.select(1, 0).select(1, 2) + m.select(1, 2).select(1, 0)),
                    0.5 * (m.select(1, 0).select(1, 1) + m.select(1, 1).select(1, 0))},
                   1);
}

}  // namespace

ClusterResult evaluate_cluster(EnergyModel& model, const at::Tensor& positions, const at::Tensor& atomic_numbers,
                               const at::Tensor& contributing, const ClusterOptions& options) {
  if (positions.dim() != 2 || positions.size(1) != 3 || positions.scalar_type() != at::kDouble) {
    throw std::invalid_argument("evaluate_cluster: positions must be [n,3] float64");
  }
  const int64_t n = positions.size(0);
  if (atomic_numbers.dim() != 1 || atomic_numbers.size(0) != n || atomic_numbers.scalar_type() != at::kLong) {
    throw std::invalid_argument("evaluate_cluster: atomic_numbers must be [n] int64");
  }
  if (contributing.dim() != 1 || contributing.size(0) != n || contributing.scalar_type() != at::kBool) {
    throw std::invalid_argument("evaluate_cluster: contributing must be [n] bool");
  }
  const at::Tensor pos_cpu = positions.to(at::kCPU).contiguous();
  check_known_elements(model.elements(), atomic_numbers);

  Structure s;
  s.positions = pos_cpu;
  s.atomic_numbers = atomic_numbers.to(at::kCPU).contiguous();
  s.cell = at::zeros({3, 3}, at::kDouble);
  s.pbc = {false, false, false};
  const NeighborList nl = build_neighbor_list(s.positions, s.cell, s.pbc, model.cutoff());
  const bool want_virial = options.virial || options.particle_virial;
  // Edge vectors r_e = r_j - r_i [E,3] (no shifts: a cluster), for the
  // distance check and the virials.
  at::Tensor vec;
  if (options.min_distance || want_virial) {
    vec = pos_cpu.index_select(0, nl.edge_index[1]) - pos_cpu.index_select(0, nl.edge_index[0]);
  }
  if (options.min_distance) check_min_distance(vec, nl, *options.min_distance);

  const auto params = model.module().parameters();
  const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().device();
  const at::ScalarType dtype = params.empty() ? at::kDouble : params.front().scalar_type();
  Batch batch = collate({&s}, {&nl}).to(device, dtype);
  const at::Tensor r = batch.positions.detach().requires_grad_(true);
  batch.positions = r;
  at::Tensor edge_grad_leaf;
  if (want_virial) {
    // Edge vectors are r_j - r_i + shifts · cell: with cell = 1 and zero
    // shifts as a leaf, ∂E/∂shifts is ∂E/∂r_e, the edge gradient.
    batch.cell = at::eye(3, batch.positions.options()).unsqueeze(0);
    edge_grad_leaf = at::zeros({nl.num_edges(), 3}, batch.positions.options()).requires_grad_(true);
    batch.shifts = edge_grad_leaf;
  }

  at::AutoGradMode grad_mode(true);
  const at::Tensor mask = contributing.to(device, dtype);
  at::Tensor node;  // [n]
  {
    InferencePathGuard inference;  // chunked kernels, first derivatives only (issue 19)
    node = model.node_energies(batch).to(dtype) * mask;
  }
  const at::Tensor e = node.sum();
  std::vector<at::Tensor> inputs{r};
  if (want_virial) inputs.push_back(edge_grad_leaf);
  const auto grads = torch::autograd::grad({e}, inputs, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);

  ClusterResult out;
  out.energy = e.item<double>();
  out.forces = grads[0].defined() ? (-grads[0]).to(at::kCPU, at::kDouble).contiguous()
                                  : at::zeros({n, 3}, at::kDouble);
  if (options.particle_energy) out.particle_energy = node.detach().to(at::kCPU, at::kDouble).contiguous();
  if (want_virial) {
    const at::Tensor g = grads[1].defined() ? grads[1].to(at::kCPU, at::kDouble)
                                            : at::zeros({nl.num_edges(), 3}, at::kDouble);
    const at::Tensor i = nl.edge_index[0], j = nl.edge_index[1];
    const at::Tensor w = voigt(vec.unsqueeze(2) * g.unsqueeze(1));  // r_e ⊗ ∂E/∂r_e [E,6]
    if (options.virial) out.virial = w.sum(0).contiguous();
    if (options.particle_virial) {
      out.particle_virial = at::zeros({n, 6}, at::kDouble).index_add_(0, i, 0.5 * w).index_add_(0, j, 0.5 * w);
    }
  }
  return out;
}

}  // namespace crucible
