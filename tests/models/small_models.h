#pragma once
// Small float64 SchNet (3 interactions) and MACE (2 interactions, 4x0e+4x1o)
// with fixed seeds, for tests that need message passing over a few hops
// (tests/deploy/test_cluster.cpp, tests/models/test_layer_nodes.cpp), and
// the models and batch that compare evaluation paths (inference against
// training path, GPU against CPU).

#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "models/helpers.h"

#include <ATen/ATen.h>

#include <memory>

namespace crucible::testing {

/// SchNet: 16 features, 12 filters, 3 interactions, 10 Gaussians, `cutoff` Å,
/// elements up to Z = 30; seed 3; float64; no energy normalization.
inline std::shared_ptr<EnergyModel> small_schnet(double cutoff) {
  SchNetOptions o;
  o.hidden_channels = 16;
  o.num_filters = 12;
  o.num_interactions = 3;
  o.num_gaussians = 10;
  o.cutoff = cutoff;
  o.max_atomic_number = 30;
  at::manual_seed(3);
  SchNet m(o);
  m->to(at::kDouble);
  return m.ptr();
}

/// MACE: 4x0e+4x1o, max_ell 2, correlation 2, 2 interactions, 6 Bessel
/// functions, radial MLP [8], readout 4, `cutoff` Å, avg_num_neighbors 6,
/// elements Al and Ti; seed 5; float64; no energy normalization.
inline std::shared_ptr<EnergyModel> small_mace(double cutoff) {
  MaceOptions o;
  o.hidden_irreps = "4x0e+4x1o";
  o.max_ell = 2;
  o.correlation = 2;
  o.num_interactions = 2;
  o.num_bessel = 6;
  o.radial_mlp = {8};
  o.readout_mlp = 4;
  o.cutoff = cutoff;
  o.avg_num_neighbors = 6.0;
  o.atomic_numbers = {13, 22};
  at::manual_seed(5);
  Mace m(o);
  m->to(at::kDouble);
  return m.ptr();
}

/// Two triclinic periodic cells (Cu; Al and Ti) and a molecule (H, C, O),
/// float64, neighbors within `cutoff` Å (brute force, helpers.h).
inline Batch mixed_batch(double cutoff) {
  return make_batch({random_periodic(5, {29}, 3), random_periodic(7, {13, 22}, 4), molecule()}, cutoff);
}

/// SchNet: 16 features, 12 filters, 3 interactions, 10 Gaussians, 3.5 Å;
/// seed 11; float64; every parameter shifted by 0.3 N(0, 1) so that biases
/// are not the small uniform values PyTorch starts them at.
inline std::shared_ptr<EnergyModel> biased_schnet() {
  at::manual_seed(11);
  SchNetOptions o;
  o.hidden_channels = 16;
  o.num_filters = 12;
  o.num_interactions = 3;
  o.num_gaussians = 10;
  o.cutoff = 3.5;
  auto m = std::make_shared<SchNetImpl>(o);
  m->to(at::kDouble);
  at::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) p.value().add_(0.3 * at::randn_like(p.value()));
  return m;
}

/// MACE: 4x0e+4x1o, max_ell 2, correlation 2, 2 interactions, radial MLP
/// [8, 8], 3.5 Å, avg_num_neighbors 8, elements H C O Al Ti Cu (those of
/// mixed_batch); seed 12; float64.
inline std::shared_ptr<EnergyModel> multi_element_mace() {
  at::manual_seed(12);
  MaceOptions o;
  o.hidden_irreps = "4x0e+4x1o";
  o.max_ell = 2;
  o.correlation = 2;
  o.num_interactions = 2;
  o.radial_mlp = {8, 8};
  o.cutoff = 3.5;
  o.avg_num_neighbors = 8.0;
  o.atomic_numbers = {1, 6, 8, 13, 22, 29};
  auto m = std::make_shared<MaceImpl>(o);
  m->to(at::kDouble);
  return m;
}

}  // namespace crucible::testing
