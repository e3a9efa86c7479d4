// evaluate_cluster (issue 17): a periodic structure cut out as a cluster of
// its home-cell atoms (contributing) and the periodic images within the
// model's interaction range (padding), as LAMMPS hands it to the KIM model,
// must give the periodic structure's energy, forces (folded onto the home
// atoms), virial (stress × volume) and per-atom energies. Oracle: the
// periodic path (compute_outputs with the periodic neighbor list). Float64.

#include "crucible/deploy/cluster.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "crucible/neighbors/neighbor_list.h"

#include "models/helpers.h"
#include "models/small_models.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>

namespace crucible {
namespace {

constexpr double kEnergyTolerance = 1e-11;  // eV, float64 sums of ~25 eV

std::shared_ptr<EnergyModel> schnet_model() {
  auto m = testing::small_schnet(2.6);
  at::Tensor e0 = at::zeros({31}, at::kDouble);  // [max_atomic_number + 1]
  e0[13] = -2.5;
  e0[22] = -5.0;
  m->set_energy_normalization(e0, 0.7, -0.2);
  return m;
}

std::shared_ptr<EnergyModel> mace_model() {
  auto m = testing::small_mace(3.2);
  at::Tensor e0 = at::zeros({119}, at::kDouble);
  e0[13] = -2.5;
  e0[22] = -5.0;
  m->set_energy_normalization(e0, 0.8, -0.3);
  return m;
}

/// The periodic structure as a cluster: home atoms first (contributing),
/// then every image within `range` Å of some home atom. image_of[k] is the
/// home atom that particle k is an image of.
struct Cluster {
  at::Tensor positions, atomic_numbers, contributing;
  std::vector<int64_t> image_of;
};

Cluster cut_out(const Structure& s, double range) {
  const int64_t n = s.positions.size(0);
  std::vector<double> pos;
  std::vector<int64_t> z, image_of;
  std::vector<bool> contributing;
  auto add = [&](const at::Tensor& r, int64_t a, bool home) {
    for (int x = 0; x < 3; ++x) pos.push_back(r[x].item<double>());
    z.push_back(s.atomic_numbers[a].item<int64_t>());
    image_of.push_back(a);
    contributing.push_back(home);
  };
  for (int64_t a = 0; a < n; ++a) add(s.positions[a], a, true);
  const int m = 4;
  for (int i = -m; i <= m; ++i)
    for (int j = -m; j <= m; ++j)
      for (int k = -m; k <= m; ++k) {
        if (i == 0 && j == 0 && k == 0) continue;
        const at::Tensor shift = at::tensor(std::vector<double>{double(i), double(j), double(k)}, at::kDouble);
        const at::Tensor offset = at::matmul(shift, s.cell);
        for (int64_t a = 0; a < n; ++a) {
          const at::Tensor r = s.positions[a] + offset;
          if ((s.positions - r).norm(2, 1).min().item<double>() < range) add(r, a, false);
        }
      }
  Cluster c;
  const auto count = static_cast<int64_t>(z.size());
  c.positions = at::tensor(pos, at::kDouble).view({count, 3});
  c.atomic_numbers = at::tensor(z, at::kLong);
  c.contributing = at::empty({count}, at::kBool);
  for (int64_t k = 0; k < count; ++k) c.contributing[k] = static_cast<bool>(contributing[static_cast<size_t>(k)]);
  c.image_of = image_of;
  return c;
}

ModelOutputs periodic_reference(EnergyModel& model, const Structure& s, at::Tensor* node) {
  const NeighborList nl = build_neighbor_list(s.positions, s.cell, s.pbc, model.cutoff());
  const Batch batch = collate({&s}, {&nl}).to(at::kCPU, at::kDouble);
  ComputeOptions co;
  co.forces = true;
  co.stress = true;
  ModelOutputs out = compute_outputs(model, batch, co);
  at::NoGradGuard no_grad;
  *node = model.node_energies(batch);
  return out;
}

class ClusterTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<EnergyModel> model() const { return GetParam() == "schnet" ? schnet_model() : mace_model(); }
};

TEST_P(ClusterTest, CutOutPeriodicStructureEqualsThePeriodicPath) {
  const auto model = this->model();
  const Structure s = testing::random_periodic(6, {13, 22}, 11, 1.8);
  at::Tensor node;
  const ModelOutputs ref = periodic_reference(*model, s, &node);
  const Cluster c = cut_out(s, model->interaction_range() + 1e-6);
  ClusterOptions o;
  o.particle_energy = o.virial = o.particle_virial = true;
  const ClusterResult r = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, o);
  const int64_t n = s.positions.size(0), count = c.positions.size(0);
  ASSERT_GT(count, 5 * n);  // the images matter

  const double e_ref = ref.energy[0].item<double>();
  EXPECT_NEAR(r.energy, e_ref, kEnergyTolerance);
  // Padding atoms add no energy; home atoms have their periodic energies.
  EXPECT_LT((r.particle_energy.slice(0, 0, n) - node).abs().max().item<double>(), 1e-10);
  EXPECT_EQ(r.particle_energy.slice(0, n).abs().max().item<double>(), 0.0);
  // Forces on images fold back onto their home atoms (LAMMPS's reverse
  // communication of ghost forces).
  at::Tensor folded = at::zeros({n, 3}, at::kDouble);
  for (int64_t k = 0; k < count; ++k) folded[c.image_of[static_cast<size_t>(k)]] += r.forces[k];
  EXPECT_LT((folded - ref.forces).abs().max().item<double>(), 1e-10);
  // KIM virial = stress × volume (ASE sign), Voigt xx yy zz yz xz xy.
  const double volume = at::linalg_det(s.cell).abs().item<double>();
  const at::Tensor sv = ref.stress[0] * volume;
  const at::Tensor expected = at::stack({sv[0][0], sv[1][1], sv[2][2], sv[1][2], sv[0][2], sv[0][1]});
  EXPECT_LT((r.virial - expected).abs().max().item<double>(), 1e-10 * std::max(1.0, expected.abs().max().item<double>()));
  // Per-atom virials sum to the virial.
  EXPECT_LT((r.particle_virial.sum(0) - r.virial).abs().max().item<double>(), 1e-10);
  // Without virials (no shifts leaf in the cluster's batch): the same
  // energy and forces.
  const ClusterResult plain = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, ClusterOptions{});
  EXPECT_NEAR(plain.energy, e_ref, kEnergyTolerance);
  EXPECT_LT((plain.forces - r.forces).abs().max().item<double>(), 1e-12);
  EXPECT_FALSE(plain.virial.defined());
}

TEST_P(ClusterTest, PerAtomVirialDoesNotDependOnTheOriginAndForcesSumToZero) {
  const auto model = this->model();
  const Structure s = testing::random_periodic(5, {13, 22}, 4, 1.8);
  const Cluster c = cut_out(s, model->interaction_range() + 1e-6);
  ClusterOptions o;
  o.virial = o.particle_virial = true;
  const ClusterResult a = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, o);
  const at::Tensor moved = c.positions + at::tensor(std::vector<double>{13.0, -7.5, 2.25}, at::kDouble);
  const ClusterResult b = evaluate_cluster(*model, moved, c.atomic_numbers, c.contributing, o);
  EXPECT_LT((a.particle_virial - b.particle_virial).abs().max().item<double>(), 1e-10);
  EXPECT_LT((a.forces - b.forces).abs().max().item<double>(), 1e-10);
  EXPECT_LT(a.forces.sum(0).abs().max().item<double>(), 1e-10);  // translation invariance
  // The virial also equals -Σ r ⊗ F over all particles.
  const at::Tensor w = -(c.positions.unsqueeze(2) * a.forces.unsqueeze(1)).sum(0);
  const at::Tensor wv = at::stack({w[0][0], w[1][1], w[2][2], 0.5 * (w[1][2] + w[2][1]), 0.5 * (w[0][2] + w[2][0]),
                                   0.5 * (w[0][1] + w[1][0])});
  EXPECT_LT((a.virial - wv).abs().max().item<double>(), 1e-9);
}

TEST_P(ClusterTest, PruningThePaddingChangesNoResult) {
  // A simulator's padding reaches past the interaction range (LAMMPS adds
  // its skin): atoms more than L hops out, and edges into atoms more than
  // L - 1 hops out, are left out; the oracle is the same cluster evaluated whole.
  const auto model = this->model();
  const Structure s = testing::random_periodic(6, {13, 22}, 11, 1.8);
  const Cluster c = cut_out(s, model->interaction_range() + 1.5 * model->cutoff());
  ClusterOptions o;
  o.particle_energy = o.virial = o.particle_virial = true;
  const ClusterResult pruned = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, o);
  o.prune_padding = false;
  const ClusterResult whole = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, o);
  const int64_t count = c.positions.size(0);
  EXPECT_EQ(whole.evaluated_atoms, count);
  EXPECT_LT(pruned.evaluated_atoms, count);
  EXPECT_LT(pruned.evaluated_edges, whole.evaluated_edges);
  EXPECT_NEAR(pruned.energy, whole.energy, kEnergyTolerance);
  EXPECT_LT((pruned.forces - whole.forces).abs().max().item<double>(), 1e-10);
  EXPECT_LT((pruned.particle_energy - whole.particle_energy).abs().max().item<double>(), 1e-10);
  EXPECT_LT((pruned.virial - whole.virial).abs().max().item<double>(), 1e-10);
  EXPECT_LT((pruned.particle_virial - whole.particle_virial).abs().max().item<double>(), 1e-10);
  // The atoms left out are exactly those whose whole-cluster forces vanish.
  const at::Tensor zero_force = pruned.forces.abs().sum(1) == 0;
  EXPECT_EQ(zero_force.sum().item<int64_t>(), count - pruned.evaluated_atoms);
  EXPECT_EQ(whole.forces.index({zero_force}).abs().max().item<double>(), 0.0);
}

/// Full per-particle lists of `positions` at `radius` (LAMMPS's cutoff +
/// skin), each list in a shuffled order (seed), as a simulator may give them.
struct SimulatorLists {
  std::vector<std::vector<int>> lists;
  NeighborListSource source() const {
    return [this](int64_t particle, int* count, const int** neighbors) {
      const auto& l = lists[static_cast<size_t>(particle)];
      *count = static_cast<int>(l.size());
      *neighbors = l.data();
    };
  }
};

SimulatorLists simulator_lists(const at::Tensor& positions, double radius, uint64_t seed) {
  const NeighborList nl = build_neighbor_list(positions, at::zeros({3, 3}, at::kDouble), {false, false, false}, radius);
  SimulatorLists s;
  s.lists.resize(static_cast<size_t>(positions.size(0)));
  for (int64_t e = 0; e < nl.num_edges(); ++e) {
    s.lists[static_cast<size_t>(nl.edge_index[0][e].item<int64_t>())].push_back(
        static_cast<int>(nl.edge_index[1][e].item<int64_t>()));
  }
  std::mt19937_64 gen(seed);
  for (auto& l : s.lists) std::shuffle(l.begin(), l.end(), gen);
  return s;
}

TEST_P(ClusterTest, SimulatorListsWithSkinEqualTheOwnList) {
  // Issue 48: the KIM model reads LAMMPS's full lists (cutoff + skin, in
  // LAMMPS's order) instead of building its own. Oracle: the overload that
  // builds Crucible's list at the cutoff, on the same cluster.
  const auto model = this->model();
  const Structure s = testing::random_periodic(6, {13, 22}, 11, 1.8);
  const Cluster c = cut_out(s, model->interaction_range() + 1.0);
  ClusterOptions o;
  o.particle_energy = o.virial = o.particle_virial = true;
  const ClusterResult own = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, o);
  const SimulatorLists lists = simulator_lists(c.positions, model->cutoff() + 1.0, 3);
  const ClusterResult r = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, lists.source(), o);
  EXPECT_EQ(r.evaluated_atoms, own.evaluated_atoms);
  EXPECT_EQ(r.evaluated_edges, own.evaluated_edges);  // the skin's pairs are left out
  EXPECT_EQ(r.layer_nodes, own.layer_nodes);
  EXPECT_NEAR(r.energy, own.energy, kEnergyTolerance);
  EXPECT_LT((r.forces - own.forces).abs().max().item<double>(), 1e-10);
  EXPECT_LT((r.particle_energy - own.particle_energy).abs().max().item<double>(), 1e-10);
  EXPECT_LT((r.virial - own.virial).abs().max().item<double>(), 1e-10);
  EXPECT_LT((r.particle_virial - own.particle_virial).abs().max().item<double>(), 1e-10);
  // Only what the contributing energies depend on: the layers' node counts
  // are those within L - 1 - t hops, the last one the contributing atoms.
  ASSERT_FALSE(r.layer_nodes.empty());
  EXPECT_EQ(r.layer_nodes.back(), s.positions.size(0));
  EXPECT_GT(r.layer_nodes.front(), r.layer_nodes.back());
  EXPECT_LT(r.evaluated_atoms, c.positions.size(0));
}

TEST_P(ClusterTest, SimulatorListsNamingAParticleOutsideTheClusterAreRefused) {
  const auto model = this->model();
  const Structure s = testing::random_periodic(4, {13, 22}, 5, 1.8);
  SimulatorLists lists = simulator_lists(s.positions, model->cutoff(), 1);
  lists.lists[0].push_back(7);  // 4 particles
  try {
    evaluate_cluster(*model, s.positions, s.atomic_numbers, at::ones({4}, at::kBool), lists.source(), {});
    FAIL() << "no error for particle 7";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the neighbor list of particle 0 names particle 7, not in [0, 4)"),
              std::string::npos)
        << e.what();
  }
}

TEST_P(ClusterTest, OnlyPaddingGivesZerosWithoutRunningTheModel) {
  // An MPI rank whose domain holds no atom passes only ghosts.
  const auto model = this->model();
  const Structure s = testing::random_periodic(5, {13, 22}, 4, 1.8);
  ClusterOptions o;
  o.particle_energy = o.virial = o.particle_virial = true;
  const at::Tensor none = at::zeros({s.positions.size(0)}, at::kBool);
  const ClusterResult r = evaluate_cluster(*model, s.positions, s.atomic_numbers, none, o);
  EXPECT_EQ(r.energy, 0.0);
  EXPECT_EQ(r.evaluated_atoms, 0);
  ASSERT_EQ(r.forces.sizes(), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(r.forces.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(r.particle_virial.sizes(), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(r.virial.abs().sum().item<double>(), 0.0);
}

TEST_P(ClusterTest, TooFewImagesChangeTheEnergy) {
  // Negative control: images only out to (range - cutoff) are not enough,
  // which shows the test above depends on the interaction range.
  const auto model = this->model();
  const Structure s = testing::random_periodic(6, {13, 22}, 11, 1.8);
  at::Tensor node;
  const ModelOutputs ref = periodic_reference(*model, s, &node);
  const Cluster c = cut_out(s, model->interaction_range() - model->cutoff());
  const ClusterResult r = evaluate_cluster(*model, c.positions, c.atomic_numbers, c.contributing, {});
  // 100 × the tolerance above (SchNet's random weights make the third hop
  // weak: 1.6e-9 eV here; MACE's second hop is far stronger).
  EXPECT_GT(std::abs(r.energy - ref.energy[0].item<double>()), 100 * kEnergyTolerance);
}

INSTANTIATE_TEST_SUITE_P(Models, ClusterTest, ::testing::Values("schnet", "mace"));

TEST(Cluster, InteractionRangeIsLayersTimesCutoff) {
  EXPECT_DOUBLE_EQ(schnet_model()->interaction_range(), 3 * 2.6);
  EXPECT_DOUBLE_EQ(mace_model()->interaction_range(), 2 * 3.2);
}

TEST(Cluster, RefusesUnknownElementsAndCloseAtoms) {
  const auto model = mace_model();
  const at::Tensor pos = at::tensor(std::vector<double>{0, 0, 0, 2.0, 0, 0, 0, 2.1, 0}, at::kDouble).view({3, 3});
  const at::Tensor all = at::ones({3}, at::kBool);
  try {
    evaluate_cluster(*model, pos, at::tensor(std::vector<int64_t>{13, 29, 22}, at::kLong), all, {});
    FAIL() << "no error for Cu";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("atom 1 is Cu, an element the model was not trained on (it knows Al Ti)"),
              std::string::npos)
        << e.what();
  }
  ClusterOptions o;
  o.min_distance = 2.05;
  try {
    evaluate_cluster(*model, pos, at::tensor(std::vector<int64_t>{13, 13, 22}, at::kLong), all, o);
    FAIL() << "no error for close atoms";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("atoms at (0.0000, 0.0000, 0.0000) and (2.0000, 0.0000, 0.0000) Å (particles 0 "
                                         "and 1) are 2.000000 Å apart, closer than the model's minimum distance 2.050000"),
              std::string::npos)
        << e.what();
  }
  // Issue 48: a ghost is named as one, by its position (LAMMPS hands the model its images).
  try {
    const at::Tensor ghost_pos = at::tensor(std::vector<double>{0, 0, 0, 5.0, 0, 0, 5.0, 2.0, 0}, at::kDouble).view({3, 3});
    evaluate_cluster(*model, ghost_pos, at::tensor(std::vector<int64_t>{13, 13, 22}, at::kLong),
                     at::tensor(std::vector<int64_t>{1, 1, 0}, at::kLong).to(at::kBool), o);
    FAIL() << "no error for an atom close to a ghost";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("atoms at (5.0000, 0.0000, 0.0000) and (5.0000, 2.0000, 0.0000) (a ghost: "
                                         "periodic or processor image) Å (particles 1 and 2)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(evaluate_cluster(*model, pos.to(at::kFloat), at::tensor(std::vector<int64_t>{13, 13, 22}, at::kLong), all, {}),
               std::invalid_argument);
}

}  // namespace
}  // namespace crucible
