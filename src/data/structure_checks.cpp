// check_structures. See include/crucible/data/structure_checks.h.

#include "crucible/data/structure_checks.h"

#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"
#include "crucible/neighbors/neighbor_list.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace crucible {

namespace {

[[noreturn]] void fail(const Structure& s, size_t index, const std::string& key,
                       const std::string& what) {
  const std::string where = s.source.empty() ? key + " structure " + std::to_string(index) : s.source;
  throw DataError(where + ": " + what);
}

double norm3(const double* v) { return std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]); }

}  // namespace

void check_structures(const std::vector<Structure>& structures, const std::string& key,
                      const StructureLimits& limits) {
  for (size_t k = 0; k < structures.size(); ++k) {
    const Structure& s = structures[k];
    const int64_t n = s.num_atoms();
    if (n == 0) fail(s, k, key, "frame must have at least one atom, got 0 (remove the empty frame)");
    const at::Tensor pos = s.positions.to(at::kDouble).contiguous();
    const double* p = pos.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      for (int d = 0; d < 3; ++d) {
        if (!(std::abs(p[3 * i + d]) <= limits.max_abs_coordinate)) {
          fail(s, k, key,
               fmt::format("coordinates must be within {:g} Å of the origin, got {:g} for atom {} "
                           "(wrong units or a corrupt file?)",
                           limits.max_abs_coordinate, p[3 * i + d], i));
        }
      }
    }
    if (s.periodic()) {
      const at::Tensor cell = s.cell.to(at::kDouble).contiguous();
      const double* c = cell.data_ptr<double>();
      double lengths = 1.0;
      for (int a = 0; a < 3; ++a) {
        const double len = norm3(c + 3 * a);
        lengths *= len;
        if (s.pbc[a] && !(len >= limits.min_lattice_vector)) {
          fail(s, k, key,
               fmt::format("periodic lattice vector {} must be at least {:g} Å long, got {:g} Å "
                           "(singular cell)",
                           "abc"[a], limits.min_lattice_vector, len));
        }
      }
      if (s.pbc[0] && s.pbc[1] && s.pbc[2]) {
        const double shape = s.volume() / lengths;
        if (!(shape >= limits.min_cell_shape)) {
          fail(s, k, key,
               fmt::format("cell must not be near-singular: volume / (|a| |b| |c|) must be at "
                           "least {:g}, got {:g} (volume {:g} Å³; linearly dependent lattice "
                           "vectors?)",
                           limits.min_cell_shape, shape, s.volume()));
        }
      }
    }
    if (s.stress && !s.has_volume()) {  // issue 47: stress only where it is defined
      fail(s, k, key,
           fmt::format("a stress label needs a periodic cell of non-zero volume (stress = -virial / volume), got "
                       "pbc {} {} {} and volume {:g} Å³ (remove the stress or set data.stress_key=none)",
                       s.pbc[0] ? "T" : "F", s.pbc[1] ? "T" : "F", s.pbc[2] ? "T" : "F", s.volume()));
    }
    if (s.energy && !(std::abs(*s.energy) / static_cast<double>(n) <= limits.max_abs_energy_per_atom)) {
      fail(s, k, key,
           fmt::format("energy per atom must be within ±{:g} eV, got {:g} eV for {} atoms (wrong "
                       "data.energy_unit?)",
                       limits.max_abs_energy_per_atom, *s.energy, n));
    }
    if (n > 1 || s.periodic()) {
      const NeighborList close = build_neighbor_list(pos, s.cell.to(at::kDouble), s.pbc, limits.min_distance);
      if (close.num_edges() > 0) {
        const int64_t i = close.edge_index[0][0].item<int64_t>();
        const int64_t j = close.edge_index[1][0].item<int64_t>();
        const at::Tensor r = pos[j] - pos[i] + close.shift_vectors[0];
        fail(s, k, key,
             fmt::format("atoms must be at least {:g} Å apart, got atoms {} and {}{} at {:.3g} Å "
                         "(duplicated atoms?)",
                         limits.min_distance, i, j, i == j ? " (a periodic image)" : "",
                         r.norm().item<double>()));
      }
    }
  }
}

void check_known_elements(const std::vector<int64_t>& known, const at::Tensor& atomic_numbers) {
  if (known.empty()) return;
  auto name = [](int64_t z) { return z >= 1 && z <= 118 ? chemical_symbol(z) : "Z=" + std::to_string(z); };
  const at::Tensor z = atomic_numbers.to(at::kCPU).contiguous();
  const int64_t* zp = z.data_ptr<int64_t>();
  for (int64_t a = 0; a < z.numel(); ++a) {
    if (std::find(known.begin(), known.end(), zp[a]) != known.end()) continue;
    std::string list;
    for (int64_t k : known) list += (list.empty() ? "" : " ") + name(k);
    throw std::invalid_argument("atom " + std::to_string(a) + " is " + name(zp[a]) +
                                ", an element the model was not trained on (it knows " + list + ")");
  }
}

}  // namespace crucible
