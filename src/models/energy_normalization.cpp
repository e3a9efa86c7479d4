// E0 and scale / shift from training data. See
// include/crucible/models/energy_normalization.h.

#include "crucible/models/energy_normalization.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

namespace crucible {

at::Tensor fit_reference_energies(const std::vector<Structure>& structures, int64_t max_z) {
  if (max_z < 1) throw std::invalid_argument("fit_reference_energies: max_z must be >= 1");
  std::vector<const Structure*> labelled;
  for (const auto& s : structures)
    if (s.energy.has_value()) labelled.push_back(&s);
  if (labelled.empty()) {
    throw std::invalid_argument("fit_reference_energies: no structure has an energy");
  }

  // Per-structure element counts n_{s,Z}.
  const int64_t S = static_cast<int64_t>(labelled.size());
  at::Tensor counts = at::zeros({S, max_z + 1}, at::kDouble);
  at::Tensor energies = at::zeros({S, 1}, at::kDouble);
  auto c = counts.accessor<double, 2>();
  auto e = energies.accessor<double, 2>();
  for (int64_t s = 0; s < S; ++s) {
    const at::Tensor z = labelled[s]->atomic_numbers.to(at::kCPU, at::kLong).contiguous();
    const int64_t* zp = z.data_ptr<int64_t>();
    for (int64_t a = 0; a < z.numel(); ++a) {
      if (zp[a] < 0 || zp[a] > max_z) {
        throw std::invalid_argument("fit_reference_energies: atomic number " + std::to_string(zp[a]) +
                                    " outside 0.." + std::to_string(max_z) + " in " + labelled[s]->source);
      }
      c[s][zp[a]] += 1.0;
    }
    e[s][0] = *labelled[s]->energy;
  }

  // Only the elements present: the count matrix [S, P].
  const at::Tensor present = counts.sum(0).gt(0).nonzero().squeeze(1);  // [P] int64
  at::Tensor result = at::zeros({max_z + 1}, at::kDouble);
  if (present.numel() == 0) return result;
  const at::Tensor A = counts.index_select(1, present);
  // gelsd: SVD-based, minimum-norm solution when rank deficient (as numpy's
  // lstsq in MACE's compute_average_E0s).
  const at::Tensor solution = std::get<0>(at::linalg_lstsq(A, energies, c10::nullopt, "gelsd"));
  result.index_copy_(0, present, solution.squeeze(1));
  return result;
}

std::vector<int64_t> inseparable_elements(const std::vector<Structure>& structures) {
  std::vector<std::vector<double>> rows;
  std::set<int64_t> present;
  std::vector<std::map<int64_t, double>> counts;
  for (const auto& s : structures) {
    if (!s.energy.has_value()) continue;
    std::map<int64_t, double> c;
    const at::Tensor z = s.atomic_numbers.to(at::kCPU, at::kLong).contiguous();
    for (int64_t a = 0; a < z.numel(); ++a) c[z.data_ptr<int64_t>()[a]] += 1.0;
    for (const auto& [zz, n] : c) present.insert(zz);
    counts.push_back(std::move(c));
  }
  const std::vector<int64_t> elements(present.begin(), present.end());
  const auto P = static_cast<int64_t>(elements.size()), S = static_cast<int64_t>(counts.size());
  if (P == 0) return {};
  at::Tensor A = at::zeros({S, P}, at::kDouble);
  auto a = A.accessor<double, 2>();
  for (int64_t i = 0; i < S; ++i)
    for (int64_t k = 0; k < P; ++k) {
      auto it = counts[static_cast<size_t>(i)].find(elements[static_cast<size_t>(k)]);
      if (it != counts[static_cast<size_t>(i)].end()) a[i][k] = it->second;
    }
  // Null space of A: the rows of Vh beyond the numerical rank (as
  // numpy.linalg.matrix_rank's tolerance). The thin SVD when S >= P: its Vh
  // is already P x P, and the full one would allocate an S x S U (12.8 GB
  // for 40000 structures; issue 47).
  const auto svd = at::linalg_svd(A, /*full_matrices=*/S < P);
  const at::Tensor sv = std::get<1>(svd), vh = std::get<2>(svd);
  const double tol = sv.numel() ? sv.max().item<double>() * static_cast<double>(std::max(S, P)) * 2.220446049250313e-16 : 0.0;
  const int64_t rank = sv.gt(tol).sum().item<int64_t>();
  std::vector<int64_t> out;
  if (rank >= P) return out;
  const at::Tensor null_rows = vh.slice(0, rank).abs().amax(0);  // [P]
  for (int64_t k = 0; k < P; ++k)
    if (null_rows[k].item<double>() > 1e-8) out.push_back(elements[static_cast<size_t>(k)]);
  return out;
}

EnergyScaling parse_energy_scaling(const std::string& name) {
  if (name == "rms_forces_scaling") return EnergyScaling::kRmsForces;
  if (name == "std_scaling") return EnergyScaling::kStd;
  if (name == "no_scaling") return EnergyScaling::kNone;
  throw std::invalid_argument("energy scaling must be rms_forces_scaling, std_scaling or "
                              "no_scaling, got '" + name + "'");
}

std::pair<double, double> fit_energy_scale_shift(const std::vector<Structure>& structures,
                                                 const at::Tensor& e0, EnergyScaling scaling,
                                                 bool fit_shift) {
  const at::Tensor e0d = e0.detach().to(at::kCPU, at::kDouble).contiguous();
  const int64_t nz = e0d.numel();
  const double* e0p = e0d.data_ptr<double>();

  std::vector<double> residuals;  // (E - Σ E0) / N per structure with an energy
  double sum_f2 = 0.0;
  int64_t n_f = 0;
  for (const auto& s : structures) {
    const int64_t n = s.num_atoms();
    if (s.energy.has_value() && n > 0) {
      const at::Tensor z = s.atomic_numbers.to(at::kCPU, at::kLong).contiguous();
      const int64_t* zp = z.data_ptr<int64_t>();
      double ref = 0.0;
      for (int64_t a = 0; a < n; ++a) {
        if (zp[a] < 0 || zp[a] >= nz) {
          throw std::invalid_argument("fit_energy_scale_shift: atomic number " + std::to_string(zp[a]) +
                                      " outside the e0 table in " + s.source);
        }
        ref += e0p[zp[a]];
      }
      residuals.push_back((*s.energy - ref) / static_cast<double>(n));
    }
    if (s.forces.has_value() && s.forces->numel() > 0) {
      sum_f2 += s.forces->to(at::kDouble).pow(2).sum().item<double>();
      n_f += s.forces->numel();
    }
  }

  double shift = 0.0;
  for (double r : residuals) shift += r;
  if (!residuals.empty()) shift /= static_cast<double>(residuals.size());

  double scale = 0.0;
  if (scaling == EnergyScaling::kNone) {
    scale = 1.0;
  } else if (scaling == EnergyScaling::kStd) {
    // Sample std (n - 1), as torch_scatter's scatter_std in MACE.
    if (residuals.size() > 1) {
      double var = 0.0;
      for (double r : residuals) var += (r - shift) * (r - shift);
      scale = std::sqrt(var / static_cast<double>(residuals.size() - 1));
    }
  } else {
    if (n_f > 0) scale = std::sqrt(sum_f2 / static_cast<double>(n_f));
    if (!(scale > 0.0) || !std::isfinite(scale)) {
      // Fallback: (population) std of the per-atom residual energies.
      scale = 0.0;
      if (residuals.size() > 1) {
        double var = 0.0;
        for (double r : residuals) var += (r - shift) * (r - shift);
        scale = std::sqrt(var / static_cast<double>(residuals.size()));
      }
    }
  }
  if (!(scale > 0.0) || !std::isfinite(scale)) scale = 1.0;  // MACE _check_non_zero
  if (!fit_shift) shift = 0.0;
  return {scale, shift};
}

}  // namespace crucible
