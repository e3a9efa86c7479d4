#pragma once
// Rattled fcc Cu supercells for the benchmarks: a = 3.61 Å, rep³ cubic
// 4-atom cells (4·rep³ atoms), Gaussian noise σ = 0.02 Å, seed 7.

#include "crucible/data/structure.h"

#include <ATen/ATen.h>

#include <random>
#include <utility>
#include <vector>

namespace crucible::bench {

/// (positions [4·rep³, 3] Å float64, cell [3,3] Å float64).
inline std::pair<at::Tensor, at::Tensor> fcc_cu(int rep) {
  const double a = 3.61;
  std::mt19937_64 gen(7);
  std::normal_distribution<double> noise(0.0, 0.02);
  const double basis[4][3] = {{0, 0, 0}, {0.5, 0.5, 0}, {0.5, 0, 0.5}, {0, 0.5, 0.5}};
  std::vector<double> pos;
  for (int x = 0; x < rep; ++x)
    for (int y = 0; y < rep; ++y)
      for (int z = 0; z < rep; ++z)
        for (const auto& b : basis) {
          pos.push_back((x + b[0]) * a + noise(gen));
          pos.push_back((y + b[1]) * a + noise(gen));
          pos.push_back((z + b[2]) * a + noise(gen));
        }
  const auto n = static_cast<int64_t>(pos.size() / 3);
  auto positions = at::from_blob(pos.data(), {n, 3}, at::kDouble).clone();
  return {positions, at::eye(3, at::kDouble) * (a * rep)};
}

/// The same cell as a periodic Cu Structure (Z = 29), no labels.
inline Structure fcc_cu_structure(int rep) {
  auto [positions, cell] = fcc_cu(rep);
  Structure s;
  s.atomic_numbers = at::full({positions.size(0)}, 29, at::kLong);
  s.positions = positions;
  s.cell = cell;
  s.pbc = {true, true, true};
  return s;
}

}  // namespace crucible::bench
