#pragma once
// Small float64 SchNet (3 interactions) and MACE (2 interactions, 4x0e+4x1o)
// with fixed seeds, for tests that need message passing over a few hops
// (tests/deploy/test_cluster.cpp, tests/models/test_layer_nodes.cpp).

#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"

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

}  // namespace crucible::testing
