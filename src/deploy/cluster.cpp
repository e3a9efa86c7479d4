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
#include <cmath>
#include <cstdint>
#include <fmt/format.h>

#include <limits>
#include <stdexcept>
#include <string>

namespace crucible {

namespace {

/// Refuses the pair (a, b) of the caller's particles, `d` Å apart, naming
/// both by their positions (the caller's coordinates: what a LAMMPS dump
/// shows) and whether each is a ghost (a periodic or processor image,
/// `contributing` false).
[[noreturn]] void refuse_close_pair(const double* positions, const bool* contributing, int64_t a, int64_t b, double d,
                                    double min_distance) {
  if (a > b) std::swap(a, b);
  auto atom = [&](int64_t k) {
    const double* r = positions + 3 * k;
    return fmt::format("({:.4f}, {:.4f}, {:.4f}){}", r[0], r[1], r[2],
                       contributing[k] ? "" : " (a ghost: periodic or processor image)");
  };
  throw std::invalid_argument(fmt::format(
      "atoms at {} and {} Å (particles {} and {}) are {:.6f} Å apart, closer than the model's minimum distance {:.6f} "
      "Å (model.json min_distance_angstrom)",
      atom(a), atom(b), a, b, d, min_distance));
}

/// The virial from the edge gradients `g` ([E,3] float64, ∂E/∂r_e) of the
/// edges `edge_index` ([2,E]) of `positions` ([n,3] float64, r_e = r_j - r_i):
/// w_e = sym(r_e ⊗ g_e) in Voigt order (xx yy zz yz xz xy), summed into
/// `virial` ([6]) and split in halves between the two atoms into
/// `particle_virial` ([n,6]) where those are defined. One pass over the edges.
void edge_virials(const at::Tensor& positions, const at::Tensor& edge_index, const at::Tensor& g, at::Tensor* virial,
                  at::Tensor* particle_virial) {
  const at::Tensor ei = edge_index.to(at::kLong).contiguous();
  const at::Tensor gc = g.contiguous();
  const int64_t m = ei.size(1);
  const int64_t* recv = ei.data_ptr<int64_t>();
  const int64_t* send = recv + m;
  const double* x = positions.data_ptr<double>();
  const double* gp = gc.data_ptr<double>();
  double* pv = particle_virial ? particle_virial->data_ptr<double>() : nullptr;
  double total[6] = {0, 0, 0, 0, 0, 0};
  for (int64_t e = 0; e < m; ++e) {
    const double* a = x + 3 * recv[e];
    const double* b = x + 3 * send[e];
    const double r[3] = {b[0] - a[0], b[1] - a[1], b[2] - a[2]};
    const double* ge = gp + 3 * e;
    const double w[6] = {r[0] * ge[0], r[1] * ge[1], r[2] * ge[2], 0.5 * (r[1] * ge[2] + r[2] * ge[1]),
                         0.5 * (r[0] * ge[2] + r[2] * ge[0]), 0.5 * (r[0] * ge[1] + r[1] * ge[0])};
    for (int k = 0; k < 6; ++k) total[k] += w[k];
    if (pv) {
      for (int k = 0; k < 6; ++k) {
        pv[6 * recv[e] + k] += 0.5 * w[k];
        pv[6 * send[e] + k] += 0.5 * w[k];
      }
    }
  }
  if (virial) *virial = at::tensor(std::vector<double>(total, total + 6), at::kDouble);
}

/// Message-passing layers L of `model`: interaction_range / cutoff, at least 1.
int64_t message_passing_layers(const EnergyModel& model) {
  return std::max<int64_t>(1, std::llround(model.interaction_range() / model.cutoff()));
}

/// The particles and edges the contributing energies depend on (see
/// ClusterOptions::prune_padding), gathered by a breadth-first walk over
/// the caller's neighbor lists: the contributing particles first (the
/// caller's order), then those 1 hop out, ... up to L hops; the lists of
/// the particles within L - 1 hops alone are read, and their pairs closer
/// than the cutoff are the edges, already sorted by receiver.
struct PrunedCluster {
  std::vector<int64_t> atoms;        ///< [n'] the caller's index of each evaluated particle, in evaluation order.
  at::Tensor edge_index;             ///< [2,E] int64: edges among them (evaluation indices, by receiver); no shifts.
  std::vector<int64_t> layer_nodes;  ///< [L] particles within L - 1 - t hops (Batch::layer_nodes); empty = all.
  std::vector<int64_t> layer_edges;  ///< [L] edges into layer t's nodes (ClusterResult::layer_edges).
  std::vector<int64_t> layer_pairs;  ///< [L] distinct pairs among them (ClusterResult::layer_pairs).
};

/// The closest pair seen, as squared distance and the caller's indices.
struct ClosestPair {
  double d2 = std::numeric_limits<double>::infinity();
  int64_t a = -1, b = -1;
  void offer(double d, int64_t i, int64_t j) {
    if (d < d2) {
      d2 = d;
      a = i;
      b = j;
    }
  }
};

/// `prune` false: every particle receives (one level, no layer_nodes).
/// @throws std::invalid_argument on a listed index outside [0, n), or a pair
///         closer than `min_distance` (pairs with a contributing particle
///         are named first: a ghost pair is an image of one).
PrunedCluster gather(const double* x, const bool* contributing, int64_t n, const NeighborListSource& neighbors,
                     double cutoff, int64_t layers, bool prune, const std::optional<double>& min_distance) {
  const double cut2 = cutoff * cutoff;
  const int64_t unreached = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> hop(static_cast<size_t>(n), unreached);
  PrunedCluster p;
  std::vector<int64_t>& order = p.atoms;
  order.reserve(static_cast<size_t>(n));
  for (int64_t a = 0; a < n; ++a) {
    if (!prune || contributing[a]) {
      hop[static_cast<size_t>(a)] = 0;
      order.push_back(a);
    }
  }
  // The edges as CSR: receiver q's senders (the caller's indices) are
  // senders[first[q] .. first[q + 1]). Kept per thread across calls, so a
  // simulator's steps reuse their capacity (no per-step growth).
  thread_local std::vector<int64_t> senders, first;
  senders.clear();
  first.assign(1, 0);
  std::vector<int64_t> within;              // within[k]: particles within k hops
  ClosestPair owned, any;
  const int64_t levels = prune ? layers : 1;  // hops 0 .. L-1 receive
  size_t begin = 0;
  for (int64_t k = 0; k < levels; ++k) {
    const size_t end = order.size();
    within.push_back(static_cast<int64_t>(end));
    for (size_t q = begin; q < end; ++q) {
      const int64_t i = order[q];
      int count = 0;
      const int* list = nullptr;
      neighbors(i, &count, &list);
      const double* xi = x + 3 * i;
      // The list compacted to the pairs closer than the cutoff without a
      // branch on the distance: a simulator's list (cutoff + skin) keeps
      // ~60% of its entries, a branch on each mispredicted.
      const size_t base = senders.size();
      senders.resize(base + static_cast<size_t>(count));
      int64_t* out = senders.data() + base;
      int64_t kept = 0;
      double closest = std::numeric_limits<double>::infinity();
      int64_t closest_j = -1;
      for (int c = 0; c < count; ++c) {
        const int64_t j = list[c];
        if (j < 0 || j >= n) {
          throw std::invalid_argument(fmt::format("the neighbor list of particle {} names particle {}, not in [0, {})", i, j, n));
        }
        const double* xj = x + 3 * j;
        const double dx = xj[0] - xi[0], dy = xj[1] - xi[1], dz = xj[2] - xi[2];
        const double d2 = dx * dx + dy * dy + dz * dz;
        out[kept] = j;
        const bool keep = (d2 < cut2) & (j != i);
        kept += keep ? 1 : 0;
        if (keep && d2 < closest) {  // rarely taken after the first few
          closest = d2;
          closest_j = j;
        }
      }
      senders.resize(base + static_cast<size_t>(kept));
      first.push_back(static_cast<int64_t>(senders.size()));
      for (int64_t e = 0; e < kept; ++e) {
        const int64_t j = out[e];
        if (hop[static_cast<size_t>(j)] == unreached) {
          hop[static_cast<size_t>(j)] = k + 1;
          order.push_back(j);
        }
      }
      if (closest_j >= 0) {
        any.offer(closest, i, closest_j);
        if (contributing[i]) {
          owned.offer(closest, i, closest_j);
        } else if (min_distance) {  // a ghost's pairs with contributing particles
          for (int64_t e = 0; e < kept; ++e) {
            const int64_t j = out[e];
            if (contributing[j]) {
              const double* xj = x + 3 * j;
              const double dx = xj[0] - xi[0], dy = xj[1] - xi[1], dz = xj[2] - xi[2];
              owned.offer(dx * dx + dy * dy + dz * dz, i, j);
            }
          }
        }
      }
    }
    // The particles found at hop k + 1 in the caller's order (a simulator
    // lists neighboring atoms near each other: better locality than the
    // order of discovery).
    std::sort(order.begin() + static_cast<std::ptrdiff_t>(end), order.end());
    begin = end;
  }
  if (min_distance) {
    const double m2 = *min_distance * *min_distance;
    const ClosestPair& named = owned.d2 < m2 ? owned : any;
    if (named.d2 < m2) refuse_close_pair(x, contributing, named.a, named.b, std::sqrt(named.d2), *min_distance);
  }
  if (prune) {
    for (int64_t t = 0; t < layers; ++t) p.layer_nodes.push_back(within[static_cast<size_t>(layers - 1 - t)]);
  }
  std::vector<int64_t> new_index(static_cast<size_t>(n), -1);
  for (size_t q = 0; q < order.size(); ++q) new_index[static_cast<size_t>(order[q])] = static_cast<int64_t>(q);
  const auto m = static_cast<int64_t>(senders.size());
  at::Tensor edge_index = at::empty({2, m}, at::kLong);
  int64_t* ri = edge_index.data_ptr<int64_t>();
  int64_t* si = ri + m;
  // Each receiver's senders in evaluation indices, ascending, as in
  // Crucible's own lists (the simulator's order is arbitrary): neighboring
  // rows are read together, and reverse_edge_pairs' cursor search applies.
  const bool ranks = static_cast<int64_t>(order.size()) <= INT32_MAX;
  thread_local std::vector<int32_t> group, sorted;
  for (size_t q = 0; q + 1 < first.size(); ++q) {
    const int64_t e = first[q], f = first[q + 1], k = f - e;
    for (int64_t a = e; a < f; ++a) ri[a] = static_cast<int64_t>(q);
    // A LAMMPS list (~40 neighbors in bin order) took std::sort ~0.6 µs of
    // mispredicted branches: 15 ms of a 16384-atom SchNet KIM step, 6 ms
    // by rank_sort (AMD EPYC VM with avx512_bf16, builds alternating).
    if (k <= kRankSortMaxItems && ranks) {
      group.resize(static_cast<size_t>(k));
      sorted.resize(static_cast<size_t>(k));
      for (int64_t a = 0; a < k; ++a) {
        group[static_cast<size_t>(a)] =
            static_cast<int32_t>(new_index[static_cast<size_t>(senders[static_cast<size_t>(e + a)])]);
      }
      rank_sort(group.data(), k, sorted.data());
      std::copy(sorted.begin(), sorted.end(), si + e);
    } else {
      for (int64_t a = e; a < f; ++a) si[a] = new_index[static_cast<size_t>(senders[static_cast<size_t>(a)])];
      std::sort(si + e, si + f);
    }
  }
  // Layer t's edges (those of its first `nodes` receivers), and its pairs:
  // an edge whose sender is also one of layer t's nodes has its reverse in
  // the layer too (that sender's list was read), and the two share one pair.
  for (const int64_t nodes : p.layer_nodes) {
    const int64_t edges = first[static_cast<size_t>(nodes)];
    int64_t shared = 0;
    for (int64_t e = 0; e < edges; ++e) shared += si[e] < nodes ? 1 : 0;
    p.layer_edges.push_back(edges);
    p.layer_pairs.push_back(edges - shared / 2);
  }
  p.edge_index = edge_index;
  return p;
}

/// The cluster as a one-structure Batch on `device` with positions in
/// `dtype`: positions [n,3] (float64 in), atomic_numbers [n] int64,
/// edge_index [2,E] int64 (used as is on the CPU). No labels (inference
/// reads none) and no shifts: a cluster's edges are r_j - r_i, so
/// edge_vectors adds nothing and reverse_edge_pairs takes them as zero.
/// The cell is zero and pbc false.
Batch cluster_batch(const at::Tensor& positions, const at::Tensor& atomic_numbers, const at::Tensor& edge_index,
                    const std::vector<int64_t>& layer_nodes, at::Device device, at::ScalarType dtype) {
  const int64_t n = positions.size(0);
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
  Batch b;
  b.positions = positions.to(device, dtype);
  b.atomic_numbers = atomic_numbers.to(device);
  b.batch = at::zeros({n}, i64);
  b.ptr = at::tensor({int64_t{0}, n}, at::kLong).to(device);
  b.num_atoms = at::full({1}, n, i64);
  b.edge_index = edge_index.to(device);
  b.cell = at::zeros({1, 3, 3}, b.positions.options());
  b.pbc = at::zeros({1, 3}, at::TensorOptions().dtype(at::kBool).device(device));
  b.config_types = {""};
  b.layer_nodes = layer_nodes;
  return b;
}

/// Energy, forces and virials of the cluster (`positions` [n,3] float64,
/// `atomic_numbers`) with edges `edge_index`, the model told
/// Batch::layer_nodes; the body of evaluate_cluster after pruning.
ClusterResult evaluate_edges(EnergyModel& model, const at::Tensor& positions, const at::Tensor& atomic_numbers,
                             const at::Tensor& edge_index, const at::Tensor& contributing,
                             const std::vector<int64_t>& layer_nodes, const ClusterOptions& options) {
  const int64_t n = positions.size(0);
  const int64_t num_edges = edge_index.size(1);
  const bool want_virial = options.virial || options.particle_virial;

  const auto params = model.module().parameters();
  const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().device();
  const at::ScalarType dtype = params.empty() ? at::kDouble : params.front().scalar_type();
  Batch batch = cluster_batch(positions, atomic_numbers, edge_index, layer_nodes, device, dtype);
  const at::Tensor r = batch.positions.detach().requires_grad_(true);
  batch.positions = r;
  at::Tensor edge_grad_leaf;
  if (want_virial) {
    // Edge vectors are r_j - r_i + shifts · cell: with cell = 1 and zero
    // shifts as a leaf, ∂E/∂shifts is ∂E/∂r_e, the edge gradient.
    batch.cell = at::eye(3, batch.positions.options()).unsqueeze(0);
    edge_grad_leaf = at::zeros({num_edges, 3}, batch.positions.options()).requires_grad_(true);
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
  out.evaluated_edges = num_edges;
  out.energy = e.item<double>();
  out.forces = grads[0].defined() ? (-grads[0]).to(at::kCPU, at::kDouble).contiguous()
                                  : at::zeros({n, 3}, at::kDouble);
  if (options.particle_energy) out.particle_energy = node.detach().to(at::kCPU, at::kDouble).contiguous();
  if (want_virial) {
    const at::Tensor g = grads[1].defined() ? grads[1].to(at::kCPU, at::kDouble)
                                            : at::zeros({num_edges, 3}, at::kDouble);
    // r_e ⊗ ∂E/∂r_e per edge (r_e = r_j - r_i: no shifts in a cluster).
    if (options.particle_virial) out.particle_virial = at::zeros({n, 6}, at::kDouble);
    edge_virials(positions, edge_index, g, options.virial ? &out.virial : nullptr,
                 options.particle_virial ? &out.particle_virial : nullptr);
  }
  return out;
}

}  // namespace

namespace {

/// Shapes and dtypes of evaluate_cluster's inputs. @throws std::invalid_argument.
void check_inputs(const at::Tensor& positions, const at::Tensor& atomic_numbers, const at::Tensor& contributing) {
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
}

}  // namespace

ClusterResult evaluate_cluster(EnergyModel& model, const at::Tensor& positions, const at::Tensor& atomic_numbers,
                               const at::Tensor& contributing, const NeighborListSource& neighbors,
                               const ClusterOptions& options) {
  const DenormalFlushGuard flush;  // the host's (LAMMPS, Python) setting comes back on return
  check_inputs(positions, atomic_numbers, contributing);
  const int64_t n = positions.size(0);
  const at::Tensor pos_cpu = positions.to(at::kCPU).contiguous();
  const at::Tensor z_cpu = atomic_numbers.to(at::kCPU).contiguous();
  const at::Tensor contributing_cpu = contributing.to(at::kCPU).contiguous();
  check_known_elements(model.elements(), z_cpu);
  const bool* cp = contributing_cpu.data_ptr<bool>();
  const int64_t num_contributing = std::count(cp, cp + n, true);
  if (num_contributing == 0) {  // e.g. an MPI rank whose domain holds no atom
    ClusterResult none;
    none.forces = at::zeros({n, 3}, at::kDouble);
    if (options.particle_energy) none.particle_energy = at::zeros({n}, at::kDouble);
    if (options.virial) none.virial = at::zeros({6}, at::kDouble);
    if (options.particle_virial) none.particle_virial = at::zeros({n, 6}, at::kDouble);
    return none;
  }
  const bool prune = options.prune_padding && num_contributing < n;
  PrunedCluster p = gather(pos_cpu.data_ptr<double>(), cp, n, neighbors, model.cutoff(),
                           message_passing_layers(model), prune, options.min_distance);
  const at::Tensor kept = at::tensor(p.atoms, at::kLong);
  const ClusterResult pruned =
      evaluate_edges(model, pos_cpu.index_select(0, kept), z_cpu.index_select(0, kept), p.edge_index,
                     contributing_cpu.index_select(0, kept), p.layer_nodes, options);
  ClusterResult out = pruned;  // back to the caller's n particles: those left out get zeros
  out.layer_nodes = p.layer_nodes;
  out.layer_edges = p.layer_edges;
  out.layer_pairs = p.layer_pairs;
  out.forces = at::zeros({n, 3}, at::kDouble).index_copy_(0, kept, pruned.forces);
  if (pruned.particle_energy.defined()) {
    out.particle_energy = at::zeros({n}, at::kDouble).index_copy_(0, kept, pruned.particle_energy);
  }
  if (pruned.particle_virial.defined()) {
    out.particle_virial = at::zeros({n, 6}, at::kDouble).index_copy_(0, kept, pruned.particle_virial);
  }
  return out;
}

ClusterResult evaluate_cluster(EnergyModel& model, const at::Tensor& positions, const at::Tensor& atomic_numbers,
                               const at::Tensor& contributing, const ClusterOptions& options) {
  check_inputs(positions, atomic_numbers, contributing);
  const int64_t n = positions.size(0);
  // Crucible's own list at the cutoff, as per-particle lists.
  const ParticleLists lists = particle_lists(build_neighbor_list(positions.to(at::kCPU), at::zeros({3, 3}, at::kDouble),
                                                                 {false, false, false}, model.cutoff()),
                                             n);
  return evaluate_cluster(model, positions, atomic_numbers, contributing, lists.source(), options);
}

NeighborListSource ParticleLists::source() const {
  return [this](int64_t particle, int* count, const int** neighbors) {
    const auto a = static_cast<size_t>(particle);
    *count = static_cast<int>(first[a + 1] - first[a]);
    *neighbors = senders.data() + first[a];
  };
}

ParticleLists particle_lists(const NeighborList& nl, int64_t n) {
  const int64_t m = nl.num_edges();
  const at::Tensor ei = nl.edge_index.to(at::kLong).contiguous();
  const int64_t* recv = ei.data_ptr<int64_t>();
  const int64_t* send = recv + m;
  ParticleLists p;
  p.senders.resize(static_cast<size_t>(m));
  p.first.assign(static_cast<size_t>(n) + 1, 0);
  for (int64_t e = 0; e < m; ++e) {
    if (recv[e] < 0 || recv[e] >= n || send[e] < 0 || send[e] >= n) {
      throw std::invalid_argument(fmt::format("particle_lists: edge {} names a particle outside [0, {})", e, n));
    }
    if (e > 0 && recv[e] < recv[e - 1]) {
      throw std::invalid_argument(fmt::format("particle_lists: the edges' receivers are not sorted (edge {})", e));
    }
    p.senders[static_cast<size_t>(e)] = static_cast<int>(send[e]);
    ++p.first[static_cast<size_t>(recv[e]) + 1];
  }
  for (int64_t a = 0; a < n; ++a) p.first[static_cast<size_t>(a) + 1] += p.first[static_cast<size_t>(a)];
  return p;
}

}  // namespace crucible
