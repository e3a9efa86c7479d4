#pragma once
// Test helpers for tests/models: hand-built structures and batches with an
// independent brute-force neighbor list (so these tests do not depend on the
// cell-list implementation or on collate()).

#include "crucible/data/batch.h"
#include "crucible/data/structure.h"

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

namespace crucible::testing {

/// Structure from row-major positions [N*3] (Å), atomic numbers, cell [9] (Å)
/// and pbc; labels unset.
inline Structure make_structure(const std::vector<double>& pos, const std::vector<int64_t>& z,
                                const std::vector<double>& cell, std::array<bool, 3> pbc) {
  Structure s;
  const auto n = static_cast<int64_t>(z.size());
  s.positions = at::tensor(pos, at::kDouble).view({n, 3}).clone();
  s.atomic_numbers = at::tensor(z, at::kLong);
  s.cell = at::tensor(cell, at::kDouble).view({3, 3}).clone();
  s.pbc = pbc;
  return s;
}

/// A triclinic periodic cell with `n` atoms of species `species` (cycled),
/// positions random in fractional coordinates but at least `dmin` Å apart
/// (minimum image over a 3x3x3 block). Deterministic for a given seed.
inline Structure random_periodic(int64_t n, const std::vector<int64_t>& species, uint64_t seed,
                                 double dmin = 1.6) {
  std::vector<double> cell{4.1, 0.0, 0.0, 0.7, 3.9, 0.0, -0.5, 0.6, 4.3};
  at::manual_seed(seed);
  std::vector<double> pos;
  std::vector<int64_t> z;
  at::Tensor c = at::tensor(cell, at::kDouble).view({3, 3});
  while (static_cast<int64_t>(z.size()) < n) {
    at::Tensor frac = at::rand({1, 3}, at::kDouble);
    at::Tensor r = at::matmul(frac, c).view({3});
    bool ok = true;
    for (size_t k = 0; k < z.size() && ok; ++k) {
      for (int a = -1; a <= 1 && ok; ++a)
        for (int b = -1; b <= 1 && ok; ++b)
          for (int g = -1; g <= 1 && ok; ++g) {
            double d2 = 0;
            for (int x = 0; x < 3; ++x) {
              double dx = r[x].item<double>() - pos[3 * k + x] + a * cell[x] + b * cell[3 + x] + g * cell[6 + x];
              d2 += dx * dx;
            }
            if (d2 < dmin * dmin) ok = false;
          }
    }
    if (!ok) continue;
    for (int x = 0; x < 3; ++x) pos.push_back(r[x].item<double>());
    z.push_back(species[z.size() % species.size()]);
  }
  return make_structure(pos, z, cell, {true, true, true});
}

/// A small non-periodic molecule (ethanol-like geometry), cell all zeros.
inline Structure molecule() {
  std::vector<double> pos{
      0.000,  0.000,  0.000,   // C
      1.520,  0.050,  0.020,   // C
      2.010,  1.350, -0.100,   // O
      -0.390, 1.020,  0.080,   // H
      -0.360, -0.520, 0.890,   // H
      -0.400, -0.500, -0.880,  // H
      1.880, -0.480,  0.910,   // H
      1.900, -0.450, -0.870,   // H
      2.980,  1.310, -0.050};  // H
  std::vector<int64_t> z{6, 6, 8, 1, 1, 1, 1, 1, 1};
  return make_structure(pos, z, std::vector<double>(9, 0.0), {false, false, false});
}

/// Brute-force neighbor list: all (i, j, S) with |r_j - r_i + S·cell| < cutoff,
/// excluding i == j with S == 0. Returns edge_index [2,E] int64, shifts [E,3] int64.
inline std::pair<at::Tensor, at::Tensor> brute_force_neighbors(const Structure& s, double cutoff) {
  const int64_t n = s.num_atoms();
  auto pos = s.positions.accessor<double, 2>();
  auto cell = s.cell.accessor<double, 2>();
  std::array<int64_t, 3> reps{0, 0, 0};
  if (s.periodic()) {
    // Cell heights: V / |b x c| etc.
    at::Tensor c = s.cell;
    const double vol = std::abs(at::linalg_det(c).item<double>());
    for (int k = 0; k < 3; ++k) {
      if (!s.pbc[k]) continue;
      at::Tensor cr = at::linalg_cross(c[(k + 1) % 3], c[(k + 2) % 3]);
      const double h = vol / cr.norm().item<double>();
      reps[k] = static_cast<int64_t>(std::ceil(cutoff / h)) + 1;
    }
  }
  std::vector<int64_t> ii, jj, ss;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t a = -reps[0]; a <= reps[0]; ++a)
        for (int64_t b = -reps[1]; b <= reps[1]; ++b)
          for (int64_t g = -reps[2]; g <= reps[2]; ++g) {
            if (i == j && a == 0 && b == 0 && g == 0) continue;
            double d2 = 0;
            for (int x = 0; x < 3; ++x) {
              const double dx = pos[j][x] - pos[i][x] + a * cell[0][x] + b * cell[1][x] + g * cell[2][x];
              d2 += dx * dx;
            }
            if (d2 < cutoff * cutoff) {
              ii.push_back(i);
              jj.push_back(j);
              ss.push_back(a);
              ss.push_back(b);
              ss.push_back(g);
            }
          }
  const auto e = static_cast<int64_t>(ii.size());
  at::Tensor edge_index = at::stack({at::tensor(ii, at::kLong), at::tensor(jj, at::kLong)});
  at::Tensor shifts = e > 0 ? at::tensor(ss, at::kLong).view({e, 3}) : at::zeros({0, 3}, at::kLong);
  if (e == 0) edge_index = at::zeros({2, 0}, at::kLong);
  return {edge_index, shifts};
}

/// max |a − b| over all elements, as a double; a and b on any device and of
/// any floating dtype (compared on the CPU in float64).
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max().item<double>();
}

/// Batch of `structures` (float64, CPU) with brute-force neighbor lists at
/// `cutoff`; labels copied where present (zero and has_* false otherwise).
inline Batch make_batch(const std::vector<Structure>& structures, double cutoff) {
  Batch b;
  std::vector<at::Tensor> pos, z, graph, ei, sh, cells, pbc, energy, forces, stress;
  std::vector<bool> he, hf, hs;
  std::vector<double> w, ew, fw, sw;
  std::vector<int64_t> ptr{0}, natoms;
  int64_t offset = 0;
  for (size_t k = 0; k < structures.size(); ++k) {
    const Structure& s = structures[k];
    const int64_t n = s.num_atoms();
    auto [edge_index, shifts] = brute_force_neighbors(s, cutoff);
    pos.push_back(s.positions);
    z.push_back(s.atomic_numbers);
    graph.push_back(at::full({n}, static_cast<int64_t>(k), at::kLong));
    ei.push_back(edge_index + offset);
    sh.push_back(shifts.to(at::kDouble));
    cells.push_back(s.cell.unsqueeze(0));
    pbc.push_back(at::tensor(std::vector<int64_t>{s.pbc[0], s.pbc[1], s.pbc[2]}, at::kLong).to(at::kBool).unsqueeze(0));
    energy.push_back(at::full({1}, s.energy.value_or(0.0), at::kDouble));
    forces.push_back(s.forces ? *s.forces : at::zeros({n, 3}, at::kDouble));
    stress.push_back(s.stress ? s.stress->unsqueeze(0) : at::zeros({1, 3, 3}, at::kDouble));
    he.push_back(s.energy.has_value());
    hf.push_back(s.forces.has_value());
    hs.push_back(s.stress.has_value());
    w.push_back(s.weight);
    ew.push_back(s.energy_weight);
    fw.push_back(s.forces_weight);
    sw.push_back(s.stress_weight);
    natoms.push_back(n);
    offset += n;
    ptr.push_back(offset);
    b.config_types.push_back(s.config_type);
  }
  auto bools = [](const std::vector<bool>& v) {
    std::vector<int64_t> x(v.begin(), v.end());
    return at::tensor(x, at::kLong).to(at::kBool);
  };
  b.positions = at::cat(pos);
  b.atomic_numbers = at::cat(z);
  b.batch = at::cat(graph);
  b.ptr = at::tensor(ptr, at::kLong);
  b.num_atoms = at::tensor(natoms, at::kLong);
  b.edge_index = at::cat(ei, 1);
  b.shifts = at::cat(sh);
  b.cell = at::cat(cells);
  b.pbc = at::cat(pbc);
  b.energy = at::cat(energy);
  b.forces = at::cat(forces);
  b.stress = at::cat(stress);
  b.has_energy = bools(he);
  b.has_forces = bools(hf);
  b.has_stress = bools(hs);
  b.weight = at::tensor(w, at::kDouble);
  b.energy_weight = at::tensor(ew, at::kDouble);
  b.forces_weight = at::tensor(fw, at::kDouble);
  b.stress_weight = at::tensor(sw, at::kDouble);
  return b;
}

/// Norm-based relative error |a - b| / max(|b|, tiny).
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double nb = b.norm().item<double>();
  return (a - b).norm().item<double>() / std::max(nb, 1e-300);
}

}  // namespace crucible::testing
