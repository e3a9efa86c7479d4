// Energy, forces and virials of a partly contributing cluster (issue 17).

#include "crucible/deploy/cluster.h"

#include "crucible/common/denormals.h"
#include "crucible/data/batch.h"
#include "crucible/data/structure_checks.h"
#include "crucible/neighbors/neighbor_list.h"
#include "crucible/neighbors/counting_sort.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <fmt/format.h>

#include <limits>
#include <stdexcept>
#include <string>

namespace crucible {

namespace {

/// The closest pair among the edges (edge vectors `vec` [E,3]), refused if
/// closer than `min_distance`, naming both atoms by their positions (the
/// caller's coordinates: what a LAMMPS dump shows) and whether each is a
/// ghost (a periodic or processor image, `contributing` false). Pairs with
/// a contributing atom are named first: a ghost pair is an image of one.
void check_min_distance(const at::Tensor& vec, const NeighborList& nl, double min_distance, const at::Tensor& positions,
                        const at::Tensor& contributing) {
  if (nl.num_edges() == 0) return;
  const at::Tensor i = nl.edge_index[0], j = nl.edge_index[1];
  const at::Tensor d = vec.norm(2, 1);
  const at::Tensor owned = contributing.index_select(0, i).logical_or(contributing.index_select(0, j));
  const at::Tensor named = at::where(owned, d, at::full_like(d, std::numeric_limits<double>::infinity()));
  int64_t e = named.argmin().item<int64_t>();
  if (!(named[e].item<double>() < min_distance)) e = d.argmin().item<int64_t>();
  const double dmin = d[e].item<double>();
  if (dmin < min_distance) {
    auto atom = [&](int64_t k) {
      const at::Tensor r = positions[k];
      return fmt::format("({:.4f}, {:.4f}, {:.4f}){}", r[0].item<double>(), r[1].item<double>(), r[2].item<double>(),
                         contributing[k].item<bool>() ? "" : " (a ghost: periodic or processor image)");
    };
    const int64_t a = std::min(i[e].item<int64_t>(), j[e].item<int64_t>());
    const int64_t b = std::max(i[e].item<int64_t>(), j[e].item<int64_t>());
    throw std::invalid_argument(fmt::format(
        "atoms at {} and {} Å (particles {} and {}) are {:.6f} Å apart, closer than the model's minimum distance {:.6f} "
        "Å (model.json min_distance_angstrom)",
        atom(a), atom(b), a, b, dmin, min_distance));
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

/// Message-passing layers L of `model`: interaction_range / cutoff, at least 1.
int64_t message_passing_layers(const EnergyModel& model) {
  return std::max<int64_t>(1, std::llround(model.interaction_range() / model.cutoff()));
}

/// Hops from the nearest contributing atom over the edges of `nl` (a
/// symmetric list), computed out to `cap`; farther atoms get cap + 1.
std::vector<int64_t> hops_from_contributing(const NeighborList& nl, const at::Tensor& contributing, int64_t cap) {
  const int64_t n = contributing.size(0), m = nl.num_edges();
  const at::Tensor ei = nl.edge_index.to(at::kLong).contiguous();
  const int64_t* recv = ei.data_ptr<int64_t>();
  const int64_t* send = recv + m;
  const at::Tensor c = contributing.contiguous();
  const bool* cp = c.data_ptr<bool>();
  std::vector<int64_t> d(static_cast<size_t>(n), cap + 1);
  for (int64_t a = 0; a < n; ++a) {
    if (cp[a]) d[static_cast<size_t>(a)] = 0;
  }
  for (int64_t k = 1; k <= cap; ++k) {
    for (int64_t e = 0; e < m; ++e) {
      const auto i = static_cast<size_t>(recv[e]), j = static_cast<size_t>(send[e]);
      if (d[i] == k - 1 && d[j] > k) d[j] = k;
      if (d[j] == k - 1 && d[i] > k) d[i] = k;
    }
  }
  return d;
}

/// The part of a cluster the contributing energies depend on (see
/// ClusterOptions::prune_padding): the kept atoms ordered by hops from the
/// contributing ones (contributing first, then 1 hop, ...), the edges among
/// them re-indexed and sorted by receiver, and each layer's node count.
struct PrunedCluster {
  at::Tensor atoms;                  ///< [n'] int64, old index of each new one.
  NeighborList nl;                   ///< edges whose receiver is within L - 1 hops.
  std::vector<int64_t> layer_nodes;  ///< [L]: atoms within L - 1 - t hops (Batch::layer_nodes).
};

PrunedCluster prune(const NeighborList& nl, const at::Tensor& contributing, int64_t layers) {
  const std::vector<int64_t> d = hops_from_contributing(nl, contributing, layers);
  const int64_t n = contributing.size(0), m = nl.num_edges();
  // Atoms sorted by hops (stable: the caller's order within one hop count);
  // those more than `layers` hops out are left out. by_hops.offsets[h] =
  // atoms fewer than h hops out; d is at most layers + 1.
  std::vector<int64_t> hop_key(static_cast<size_t>(n));
  for (int64_t a = 0; a < n; ++a) {
    const int64_t h = d[static_cast<size_t>(a)];
    hop_key[static_cast<size_t>(a)] = h <= layers ? h : -1;
  }
  const KeyGroups by_hops = counting_sort(hop_key.data(), n, layers + 1);
  PrunedCluster p;
  for (int64_t t = 0; t < layers; ++t) p.layer_nodes.push_back(by_hops.offsets[static_cast<size_t>(layers - t)]);
  const std::vector<int64_t>& keep = by_hops.order;
  const auto kept = static_cast<int64_t>(keep.size());
  std::vector<int64_t> new_index(static_cast<size_t>(n), -1);
  for (int64_t q = 0; q < kept; ++q) new_index[static_cast<size_t>(keep[static_cast<size_t>(q)])] = q;
  // Edges into atoms within L - 1 hops (their senders are within L), sorted
  // by new receiver (stable); the others' features at no layer matter.
  const at::Tensor ei = nl.edge_index.to(at::kLong).contiguous();
  const int64_t* recv = ei.data_ptr<int64_t>();
  const int64_t* send = recv + m;
  std::vector<int64_t> receiver_key(static_cast<size_t>(m));
  for (int64_t e = 0; e < m; ++e) {
    const auto r = static_cast<size_t>(recv[e]);
    receiver_key[static_cast<size_t>(e)] = d[r] <= layers - 1 ? new_index[r] : -1;
  }
  const KeyGroups by_receiver = counting_sort(receiver_key.data(), m, kept);
  const auto count = static_cast<int64_t>(by_receiver.order.size());
  at::Tensor edge_index = at::empty({2, count}, at::kLong);
  int64_t* ri = edge_index.data_ptr<int64_t>();
  int64_t* si = ri + count;
  for (int64_t slot = 0; slot < count; ++slot) {
    const int64_t e = by_receiver.order[static_cast<size_t>(slot)];
    ri[slot] = receiver_key[static_cast<size_t>(e)];
    si[slot] = new_index[static_cast<size_t>(send[e])];
  }
  const at::Tensor idx = at::tensor(by_receiver.order, at::kLong).view({count});
  p.atoms = at::tensor(keep, at::kLong).view({kept});
  p.nl.edge_index = edge_index;
  p.nl.shifts = nl.shifts.index_select(0, idx);
  p.nl.shift_vectors = nl.shift_vectors.index_select(0, idx);
  return p;
}

/// Energy, forces and virials of the cluster `s` with edges `nl`, the model
/// told Batch::layer_nodes; the body of evaluate_cluster after pruning.
ClusterResult evaluate_edges(EnergyModel& model, const Structure& s, const NeighborList& nl,
                             const at::Tensor& contributing, const std::vector<int64_t>& layer_nodes,
                             const ClusterOptions& options) {
  const int64_t n = s.positions.size(0);
  const at::Tensor& pos_cpu = s.positions;
  const bool want_virial = options.virial || options.particle_virial;
  // Edge vectors r_e = r_j - r_i [E,3] (no shifts: a cluster), for the virials.
  at::Tensor vec;
  if (want_virial) vec = pos_cpu.index_select(0, nl.edge_index[1]) - pos_cpu.index_select(0, nl.edge_index[0]);

  const auto params = model.module().parameters();
  const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().device();
  const at::ScalarType dtype = params.empty() ? at::kDouble : params.front().scalar_type();
  Batch batch = collate({&s}, {&nl});
  batch.layer_nodes = layer_nodes;
  batch = batch.to(device, dtype);
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
  const at::Tensor mask = contributing.to(device, at::kDouble);
  at::Tensor node;  // [n] float64
  {
    InferencePathGuard inference;  // chunked kernels, first derivatives only (issue 19)
    node = model.node_energies(batch).to(at::kDouble) * mask;
  }
  // Per-atom energies and the total in float64 whatever the model's dtype
  // (EnergyModel::energy): a float32 sum over 10^5 atoms would lose ~1e-2 eV.
  const at::Tensor e = node.sum();
  std::vector<at::Tensor> inputs{r};
  if (want_virial) inputs.push_back(edge_grad_leaf);
  const auto grads = torch::autograd::grad({e}, inputs, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);

  ClusterResult out;
  out.evaluated_atoms = n;
  out.evaluated_edges = nl.num_edges();
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

}  // namespace

ClusterResult evaluate_cluster(EnergyModel& model, const at::Tensor& positions, const at::Tensor& atomic_numbers,
                               const at::Tensor& contributing, const ClusterOptions& options) {
  const DenormalFlushGuard flush;  // the host's (LAMMPS, Python) setting comes back on return
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
  NeighborList nl = build_neighbor_list(s.positions, s.cell, s.pbc, model.cutoff());
  const at::Tensor contributing_cpu = contributing.to(at::kCPU);
  if (options.min_distance) {  // on every pair, in the caller's indices
    check_min_distance(pos_cpu.index_select(0, nl.edge_index[1]) - pos_cpu.index_select(0, nl.edge_index[0]), nl,
                       *options.min_distance, pos_cpu, contributing_cpu);
  }
  at::Tensor kept;  // [n'] old indices of the atoms evaluated, in evaluation order; undefined = all
  std::vector<int64_t> layer_nodes;
  const int64_t num_contributing = contributing_cpu.sum().item<int64_t>();
  if (num_contributing == 0) {  // e.g. an MPI rank whose domain holds no atom
    ClusterResult none;
    none.forces = at::zeros({n, 3}, at::kDouble);
    if (options.particle_energy) none.particle_energy = at::zeros({n}, at::kDouble);
    if (options.virial) none.virial = at::zeros({6}, at::kDouble);
    if (options.particle_virial) none.particle_virial = at::zeros({n, 6}, at::kDouble);
    return none;
  }
  if (options.prune_padding && num_contributing < n) {
    PrunedCluster p = prune(nl, contributing_cpu, message_passing_layers(model));
    kept = p.atoms;
    layer_nodes = std::move(p.layer_nodes);
    nl = std::move(p.nl);
    s.positions = pos_cpu.index_select(0, kept);
    s.atomic_numbers = s.atomic_numbers.index_select(0, kept);
  }
  const ClusterResult pruned = evaluate_edges(
      model, s, nl, kept.defined() ? contributing_cpu.index_select(0, kept) : contributing_cpu, layer_nodes, options);
  if (!kept.defined()) return pruned;
  ClusterResult out = pruned;  // back to the caller's n particles: those left out get zeros
  out.forces = at::zeros({n, 3}, at::kDouble).index_copy_(0, kept, pruned.forces);
  if (pruned.particle_energy.defined()) {
    out.particle_energy = at::zeros({n}, at::kDouble).index_copy_(0, kept, pruned.particle_energy);
  }
  if (pruned.particle_virial.defined()) {
    out.particle_virial = at::zeros({n, 6}, at::kDouble).index_copy_(0, kept, pruned.particle_virial);
  }
  return out;
}

}  // namespace crucible
