#pragma once
// Energy, forces and virials of a cluster of atoms of which only some
// contribute their energy: the compute of the KIM model (issue 17), where a
// simulator passes its own atoms and the padding (ghost) atoms of its
// domain. Design: docs/deployment_kim.md.

#include "crucible/models/energy_model.h"
#include "crucible/neighbors/neighbor_list.h"

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <vector>

namespace crucible {

/// What evaluate_cluster computes besides energy and forces.
struct ClusterOptions {
  bool particle_energy = false;  ///< per-particle energies. Default false.
  bool virial = false;           ///< the global virial. Default false.
  bool particle_virial = false;  ///< per-particle virials. Default false.
  /// Refuse two atoms closer than this, Å (the model's minimum distance,
  /// model.json "min_distance_angstrom"). Unset = no check.
  std::optional<double> min_distance;
  /// Evaluate only what the contributing energies depend on (default true).
  /// With L = interaction_range / cutoff message-passing layers over the
  /// cutoff graph, an atom's features after layer l reach the atoms within
  /// L - l hops: so edges into atoms more than L - 1 hops from every
  /// contributing atom, and atoms more than L hops away, change no
  /// contributing energy and are left out (their forces and per-particle
  /// values are exactly 0). The kept atoms are ordered by hops and the
  /// edges by receiver, and Batch::layer_nodes tells the model to compute
  /// layer t only for the atoms within L - 1 - t hops (its last layer for
  /// the contributing atoms alone). Measured through LAMMPS
  /// (bench/bench_deploy.py, MACE 2 layers at 5 Å, fcc Cu, float64), ms per
  /// simulated atom at 2048 atoms (12195 particles with the ghosts): 29.2
  /// whole, 5.9 with the dropped atoms and edges, 4.3 with per-layer nodes;
  /// at 256 atoms 76.8, 9.4, 7.3. false evaluates every particle and edge.
  bool prune_padding = true;
};

/// Results of evaluate_cluster (CPU, float64).
struct ClusterResult {
  double energy = 0;        ///< Σ over contributing particles of their energies, eV.
  at::Tensor forces;        ///< [n,3] eV/Å: -∂energy/∂r for every particle, padding included.
  at::Tensor particle_energy;  ///< [n] eV: node energies of contributing particles, 0 for padding.
  /// [6] eV, KIM's virial in Voigt order (xx yy zz yz xz xy):
  /// V = Σ_e r_e ⊗ ∂E/∂r_e over the edges e of the cluster (r_e the edge
  /// vector), symmetrised; equals -Σ_i r_i ⊗ F_i and, for a periodic
  /// structure, stress × volume (ASE sign). LAMMPS's virial is -V.
  at::Tensor virial;
  /// [n,6] eV: each edge's r_e ⊗ ∂E/∂r_e split in halves between its two
  /// atoms (as KIM's example pair drivers and LAMMPS's ev_tally split a
  /// pair's virial); sums to `virial`, and is independent of the origin.
  at::Tensor particle_virial;
  int64_t evaluated_atoms = 0;  ///< particles the model ran on (after prune_padding).
  int64_t evaluated_edges = 0;  ///< directed edges it ran on.
  /// [L] particles each message-passing layer ran on (Batch::layer_nodes);
  /// empty where every layer ran on all evaluated_atoms.
  std::vector<int64_t> layer_nodes;
  /// [L] edges layer t ran on (those into its layer_nodes); empty as above.
  std::vector<int64_t> layer_edges;
  /// [L] distinct pairs among layer t's edges: a pair counts once where both
  /// directions are among them (SchNet's filter network and MACE's radial
  /// splines run once per pair), twice where the reverse edge's receiver is
  /// outside the layer's nodes (a padding particle's outward edges). A
  /// periodic structure has half its edges as pairs. Empty as above.
  std::vector<int64_t> layer_pairs;
};

/// A simulator's full neighbor lists, as KIM's GetNeighborList callback
/// gives them: sets `*count` and `*neighbors` to the particles (indices in
/// [0, n)) listed for `particle`. A list must hold every particle closer
/// than the model's cutoff and may hold more (LAMMPS adds its skin): those
/// are left out by distance. Lists are read for the contributing particles
/// and for the padding particles within L - 1 hops of them (L message-
/// passing layers), i.e. within (L - 1) · cutoff: KIM's
/// modelWillNotRequestNeighborsOfNoncontributingParticles = 0. The pointer
/// must stay valid until the next call. May throw (the exception passes).
using NeighborListSource = std::function<void(int64_t particle, int* count, const int** neighbors)>;

/// Per-particle lists of a NeighborList's edges (each receiver's senders, in
/// the list's order), readable as a NeighborListSource: a simulator's lists
/// made here (the overload below, tests, bench_inference --cluster-rounds).
struct ParticleLists {
  std::vector<int64_t> first;  ///< [n + 1] offsets of each particle's list in `senders`.
  std::vector<int> senders;    ///< [E] sender (edge_index[1]) of each edge.
  /// The lists as a NeighborListSource; valid while this object lives.
  NeighborListSource source() const;
};

/// The lists of `nl` (edges sorted by receiver, as build_neighbor_list
/// gives them) over `n` particles.
/// @throws std::invalid_argument if the receivers are not sorted or an
///         edge names a particle outside [0, n).
ParticleLists particle_lists(const NeighborList& nl, int64_t n);

/// As below, with the edges taken from the simulator's neighbor lists
/// `neighbors` instead of a neighbor list built here: the KIM model's
/// compute (issue 48), which reads LAMMPS's lists and builds none of its
/// own. Edges are the listed pairs closer than model.cutoff(), walked
/// breadth-first from the contributing particles: only what a contributing
/// energy depends on is read (ClusterOptions::prune_padding), and the
/// minimum-distance check covers those pairs. Same results as the overload
/// below to rounding (the edges' order may differ).
/// @throws std::invalid_argument as below, or on a listed index outside [0, n).
ClusterResult evaluate_cluster(EnergyModel& model, const at::Tensor& positions, const at::Tensor& atomic_numbers,
                               const at::Tensor& contributing, const NeighborListSource& neighbors,
                               const ClusterOptions& options);

/// Energy, forces and virials of the non-periodic cluster `positions`
/// ([n,3] Å, float64) / `atomic_numbers` ([n] int64), where only particles
/// with `contributing` ([n] bool) add their energy. Edges come from
/// Crucible's neighbor list at model.cutoff() on all particles. A
/// contributing atom's energy is exact as long as every atom within
/// model.interaction_range() of it is in the cluster, which is what a
/// domain decomposition with that influence distance guarantees; padding
/// atoms' own energies are ignored. The model runs in its own dtype (load it
/// in float64 for MD). No parameter gradients are kept. Denormals flush to
/// zero during the call; the host's setting is restored after it
/// (common/denormals.h).
/// @throws std::invalid_argument on wrong shapes or dtypes, an element the
///         model does not know (naming it and the known ones), or two atoms
///         closer than options.min_distance (naming both and the distance).
ClusterResult evaluate_cluster(EnergyModel& model, const at::Tensor& positions, const at::Tensor& atomic_numbers,
                               const at::Tensor& contributing, const ClusterOptions& options);

}  // namespace crucible
