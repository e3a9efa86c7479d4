// Issue 48, item 3: the ZBL screened nuclear repulsion as an option of the
// models trained here (SchNet, MACE), saved with the model. Oracles: the
// ZBL formula evaluated pair by pair in this file (Ziegler, Biersack &
// Littmark 1985 with MACE's screening length, ASE's covalent radii), finite
// differences of the energy, and the model without the term. Imported MACE
// models with MACE's own ZBL are checked against MACE's numbers in
// test_mace_import.cpp (ZblPairRepulsionIsImportedAndReproducesMace).

#include "crucible/models/energy_model.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/registry.h"
#include "crucible/models/schnet.h"
#include "crucible/models/zbl.h"
#include "models/helpers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

namespace crucible {
namespace {

using testing::make_batch;
using testing::make_structure;

/// ½ V_ZBL(r) f(r / (R_i + R_j)) for one directed pair, written out.
double zbl_pair(double r, int zi, int zj, double ri, double rj, int p) {
  const double a = 0.4543 * 0.529 / (std::pow(zi, 0.3) + std::pow(zj, 0.3));
  const double x = r / a;
  const double phi = 0.1818 * std::exp(-3.2 * x) + 0.5099 * std::exp(-0.9423 * x) + 0.2802 * std::exp(-0.4028 * x) +
                     0.02817 * std::exp(-0.2016 * x);
  const double u = r / (ri + rj);
  const double pp = p;
  const double env = u < 1 ? 1 - (pp + 1) * (pp + 2) / 2 * std::pow(u, p) + pp * (pp + 2) * std::pow(u, p + 1) -
                                 pp * (pp + 1) / 2 * std::pow(u, p + 2)
                           : 0.0;
  return 0.5 * 14.3996 * zi * zj / r * phi * env;
}

/// An Al-Ti-Al chain with a close pair (0.9 Å) and one at 2.1 Å, non-periodic.
Structure close_trimer() {
  return make_structure({0.0, 0.0, 0.0, 0.9, 0.1, 0.0, 2.8, 0.5, 0.3}, {13, 22, 13}, std::vector<double>(9, 0.0),
                        {false, false, false});
}

TEST(Zbl, NodeEnergiesEqualThePairFormula) {
  const Structure s = close_trimer();
  const Batch b = make_batch({s}, 4.0);
  const ZblParameters zbl = default_zbl_parameters(5);
  const at::Tensor vec = b.positions.index_select(0, b.edge_index[1]) - b.positions.index_select(0, b.edge_index[0]);
  const at::Tensor r = vec.pow(2).sum(1).sqrt();
  const at::Tensor got = zbl_node_energies(r, b.atomic_numbers, b.edge_index, 3, zbl);
  // Covalent radii (Cordero et al. 2008): Al 1.21 Å, Ti 1.60 Å.
  EXPECT_DOUBLE_EQ(zbl.covalent_radii[13].item<double>(), 1.21);
  EXPECT_DOUBLE_EQ(zbl.covalent_radii[22].item<double>(), 1.60);
  std::vector<double> want(3, 0.0);
  const int z[3] = {13, 22, 13};
  const double R[3] = {1.21, 1.60, 1.21};
  for (int64_t e = 0; e < b.num_edges(); ++e) {
    const int64_t i = b.edge_index[0][e].item<int64_t>(), j = b.edge_index[1][e].item<int64_t>();
    want[static_cast<size_t>(i)] += zbl_pair(r[e].item<double>(), z[i], z[j], R[i], R[j], 5);
  }
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(got[k].item<double>(), want[static_cast<size_t>(k)], 1e-12 * std::abs(want[k]) + 1e-14) << k;
  EXPECT_GT(want[0], 1.0);  // the 0.9 Å Al-Ti pair: several eV
  EXPECT_GT(want[2], 0.0);  // 1.97 Å from Ti, inside 1.21 + 1.60 Å
  // The Al-Al pair at 2.86 Å lies beyond 2 × 1.21 Å: the envelope cuts it.
  EXPECT_EQ(zbl_pair(2.86, 13, 13, 1.21, 1.21, 5), 0.0);
}

/// The model with pair_repulsion = the same weights without it + the ZBL
/// energies; forces are −∂E/∂r (central differences).
void expect_model_adds_zbl(const std::shared_ptr<EnergyModel>& with, const std::shared_ptr<EnergyModel>& without,
                           const char* what) {
  const Structure s = close_trimer();
  const Batch b = make_batch({s}, with->cutoff());
  ComputeOptions co;
  co.forces = true;
  co.energies = true;
  const ModelOutputs a = compute_outputs(*with, b, co), c = compute_outputs(*without, b, co);
  const at::Tensor vec = b.positions.index_select(0, b.edge_index[1]) - b.positions.index_select(0, b.edge_index[0]);
  const at::Tensor zbl =
      zbl_node_energies(vec.pow(2).sum(1).sqrt(), b.atomic_numbers, b.edge_index, 3, default_zbl_parameters(5));
  EXPECT_LT((a.energies - c.energies - zbl).abs().max().item<double>(), 1e-10) << what;
  EXPECT_GT(zbl.sum().item<double>(), 1.0) << what;
  // Finite differences of the energy with the term.
  const double h = 1e-5;
  for (int64_t atom : {0, 1}) {
    for (int k = 0; k < 3; ++k) {
      Structure sp = s, sm = s;
      sp.positions = s.positions.clone();
      sm.positions = s.positions.clone();
      sp.positions[atom][k] += h;
      sm.positions[atom][k] -= h;
      co.energies = false;
      const double ep = compute_outputs(*with, make_batch({sp}, with->cutoff()), co).energy.item<double>();
      const double em = compute_outputs(*with, make_batch({sm}, with->cutoff()), co).energy.item<double>();
      EXPECT_NEAR(a.forces[atom][k].item<double>(), -(ep - em) / (2 * h), 1e-5 * (1 + std::abs(a.forces[atom][k].item<double>())))
          << what << " atom " << atom << " axis " << k;
    }
  }
  // The close pair repels: atom 0 is pushed away from atom 1 (−x).
  EXPECT_LT(a.forces[0][0].item<double>(), c.forces[0][0].item<double>() - 1.0) << what;
}

TEST(Zbl, SchNetWithPairRepulsionAddsItAfterScaleAndShift) {
  SchNetOptions o;
  o.hidden_channels = 8;
  o.num_filters = 8;
  o.num_interactions = 2;
  o.cutoff = 4.0;
  o.max_atomic_number = 30;
  at::manual_seed(40);
  auto without = std::make_shared<SchNetImpl>(o);
  o.pair_repulsion = true;
  auto with = std::make_shared<SchNetImpl>(o);
  at::Tensor e0 = at::zeros({31}, at::kDouble);
  e0[13] = -2.5;
  e0[22] = -5.1;
  for (auto& m : {with, without}) {
    m->to(at::kDouble);
    m->set_energy_normalization(e0, 2.0, 0.3);  // ZBL must not be scaled by 2
  }
  {
    at::NoGradGuard no_grad;
    auto src = without->named_parameters();
    for (auto& p : with->named_parameters()) p.value().copy_(src[p.key()]);
  }
  expect_model_adds_zbl(with, without, "schnet");
}

TEST(Zbl, MaceTrainedHereWithPairRepulsionAddsItAfterScaleAndShift) {
  MaceOptions o;
  o.hidden_irreps = "4x0e+4x1o";
  o.max_ell = 2;
  o.correlation = 2;
  o.num_interactions = 2;
  o.radial_mlp = {8};
  o.readout_mlp = 4;
  o.cutoff = 4.0;
  o.avg_num_neighbors = 2.0;
  o.atomic_numbers = {13, 22};
  at::manual_seed(41);
  auto without = std::make_shared<MaceImpl>(o);
  o.pair_repulsion = true;
  at::manual_seed(41);
  auto with = std::make_shared<MaceImpl>(o);
  for (auto& m : {with, without}) {
    m->to(at::kDouble);
    m->set_energy_normalization(at::zeros({119}, at::kDouble), 2.0, 0.3);
  }
  expect_model_adds_zbl(with, without, "mace");
}

TEST(Zbl, TheOptionTravelsThroughModelJsonAndIsAConfigKey) {
  for (const char* type : {"schnet", "mace"}) {
    const ModelFactory& f = model_factory(type);
    bool listed = false;
    for (const auto& k : f.keys) listed |= k.name == "pair_repulsion" && std::get<bool>(k.default_value) == false;
    EXPECT_TRUE(listed) << type;
  }
  SchNetOptions so;
  so.pair_repulsion = true;
  const auto schnet = std::make_shared<SchNetImpl>(so);
  const nlohmann::json h = model_factory("schnet").to_json(*schnet);
  EXPECT_TRUE(h.at("pair_repulsion").get<bool>());
  auto back = std::dynamic_pointer_cast<SchNetImpl>(model_factory("schnet").from_json(h));
  EXPECT_TRUE(back->options().pair_repulsion);
  EXPECT_EQ(back->named_buffers().size(), schnet->named_buffers().size());
  MaceOptions mo;
  mo.atomic_numbers = {13, 22};
  mo.pair_repulsion = true;
  const auto mace = std::make_shared<MaceImpl>(mo);
  const nlohmann::json hm = model_factory("mace").to_json(*mace);
  EXPECT_TRUE(hm.at("pair_repulsion").get<bool>());
  EXPECT_FALSE(hm.contains("basis"));
  EXPECT_TRUE(std::dynamic_pointer_cast<MaceImpl>(model_factory("mace").from_json(hm))->options().pair_repulsion);
}

}  // namespace
}  // namespace crucible
