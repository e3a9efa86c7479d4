// Cell-list (binning) neighbor list for triclinic cells with mixed pbc.
//
// Algorithm (after ase.neighborlist.primitive_neighbor_list, ASE 3.22, and the
// classic linked-cell method, Allen & Tildesley, "Computer Simulation of
// Liquids", section on cell structures and linked lists):
//   1. Build a binning basis B whose rows are the periodic lattice vectors;
//      non-periodic directions get orthonormal vectors completing the basis
//      (the user's cell is ignored there, exactly as shifts are zero there).
//   2. Fractional coordinates f = x · B^-1. Periodic directions: wrap f into
//      [0,1) and remember the integer wrap cs (x = wrapped + cs·cell).
//      Non-periodic directions: bins span the bounding range of the atoms.
//   3. Bins per direction n_c = max(1, floor(extent_c / (cutoff/2))), extent_c
//      measured along the face normal (cell height h_c); at most ~2 bins per
//      atom. Atoms are counting-sorted into bins (wrapped Cartesian positions
//      stored contiguously in bin order).
//   4. For atom i, the bins to scan along c are those overlapping
//      [f_i - cutoff/h_c, f_i + cutoff/h_c] in "unwrapped" bin indices
//      t = bin + s·n_c; periodic directions map t to (bin, image s), which
//      covers several images when the cutoff exceeds the cell height.
//      Non-periodic directions clip t to the grid (no images).
//   5. For every atom j found: S = s + cs_i - cs_j (shift relative to the
//      ORIGINAL positions) and D = x_j - x_i + S·cell; keep |D| < cutoff
//      (strict, as ASE), dropping i == j with S == 0. A cheap prefilter on the
//      wrapped positions (with a generous rounding margin) comes first.
// Distinct t give distinct (bin, image) pairs, so no pair is produced twice and
// no deduplication is needed. Cost is O(N) for a fixed density and cutoff.
// Edges of each atom i are sorted by (j, S); atoms are visited in order.

#include "crucible/neighbors/neighbor_list.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace crucible {
namespace {

using Vec3 = std::array<double, 3>;
using Mat3 = std::array<Vec3, 3>;  // row-major: m[r][c]

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << '[';
  for (int64_t d = 0; d < t.dim(); ++d) os << (d ? "," : "") << t.size(d);
  os << ']';
  return os.str();
}

std::string num_str(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

Vec3 cross(const Vec3& a, const Vec3& b) {
  return {a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]};
}
double dot(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
double norm(const Vec3& a) { return std::sqrt(dot(a, a)); }
Vec3 scaled(const Vec3& a, double s) { return {a[0] * s, a[1] * s, a[2] * s}; }

bool finite3(const Vec3& a) {
  return std::isfinite(a[0]) && std::isfinite(a[1]) && std::isfinite(a[2]);
}

// Floor division for possibly negative numerators (d > 0).
inline int64_t floor_div(int64_t a, int64_t d) {
  int64_t q = a / d;
  if ((a % d != 0) && (a < 0)) --q;
  return q;
}

// Binning basis: periodic rows are the lattice vectors, non-periodic rows are
// orthonormal vectors orthogonal to the periodic ones. Throws if a periodic
// direction is degenerate (zero/non-finite vector, or linearly dependent).
Mat3 binning_basis(const Mat3& cell, const std::array<bool, 3>& pbc) {
  std::vector<int> per, nonper;
  for (int c = 0; c < 3; ++c) (pbc[c] ? per : nonper).push_back(c);
  const char* names = "abc";

  for (int c : per) {
    if (!finite3(cell[c]) || !(norm(cell[c]) > 0.0)) {
      std::ostringstream os;
      os << "cell vector " << names[c]
         << " must be non-zero and finite along a periodic direction, got (" << cell[c][0]
         << ", " << cell[c][1] << ", " << cell[c][2] << ")";
      throw std::invalid_argument(os.str());
    }
  }

  Mat3 basis{};
  constexpr double kRelTol = 1e-10;
  if (per.size() == 3) {
    basis = cell;
    const double vol = dot(cell[0], cross(cell[1], cell[2]));
    const double scale = norm(cell[0]) * norm(cell[1]) * norm(cell[2]);
    if (!(std::abs(vol) > kRelTol * scale)) {
      throw std::invalid_argument(
          "cell must be non-degenerate along periodic directions (|det| > 1e-10 |a||b||c|), "
          "got det = " + num_str(vol));
    }
  } else if (per.size() == 2) {
    const Vec3& a = cell[per[0]];
    const Vec3& b = cell[per[1]];
    const Vec3 n = cross(a, b);
    const double nn = norm(n);
    if (!(nn > kRelTol * norm(a) * norm(b))) {
      std::ostringstream os;
      os << "periodic cell vectors " << names[per[0]] << " and " << names[per[1]]
         << " must be linearly independent, got |" << names[per[0]] << " x " << names[per[1]]
         << "| = " << num_str(nn);
      throw std::invalid_argument(os.str());
    }
    basis[per[0]] = a;
    basis[per[1]] = b;
    basis[nonper[0]] = scaled(n, 1.0 / nn);
  } else if (per.size() == 1) {
    const Vec3& a = cell[per[0]];
    const Vec3 ah = scaled(a, 1.0 / norm(a));
    // Cartesian axis least aligned with a.
    int k = 0;
    for (int d = 1; d < 3; ++d)
      if (std::abs(ah[d]) < std::abs(ah[k])) k = d;
    Vec3 e{0.0, 0.0, 0.0};
    e[k] = 1.0;
    Vec3 u = cross(ah, e);
    u = scaled(u, 1.0 / norm(u));
    const Vec3 v = cross(ah, u);  // unit: ah ⟂ u, both unit
    basis[per[0]] = a;
    basis[nonper[0]] = u;
    basis[nonper[1]] = v;
  } else {
    basis = {Vec3{1.0, 0.0, 0.0}, Vec3{0.0, 1.0, 0.0}, Vec3{0.0, 0.0, 1.0}};
  }
  return basis;
}

// Reciprocal vectors g_c (g_c · basis_d = δ_cd): f_c = x · g_c.
Mat3 reciprocal(const Mat3& b) {
  const Vec3 c12 = cross(b[1], b[2]);
  const Vec3 c20 = cross(b[2], b[0]);
  const Vec3 c01 = cross(b[0], b[1]);
  const double det = dot(b[0], c12);
  return {scaled(c12, 1.0 / det), scaled(c20, 1.0 / det), scaled(c01, 1.0 / det)};
}

struct Edge {
  int64_t j;
  int64_t s[3];
  bool operator<(const Edge& o) const {
    if (j != o.j) return j < o.j;
    if (s[0] != o.s[0]) return s[0] < o.s[0];
    if (s[1] != o.s[1]) return s[1] < o.s[1];
    return s[2] < o.s[2];
  }
};

NeighborList empty_list() {
  NeighborList nl;
  nl.edge_index = at::empty({2, 0}, at::kLong);
  nl.shifts = at::empty({0, 3}, at::kLong);
  nl.shift_vectors = at::empty({0, 3}, at::kDouble);
  return nl;
}

}  // namespace

NeighborList build_neighbor_list(const at::Tensor& positions, const at::Tensor& cell,
                                 std::array<bool, 3> pbc, double cutoff) {
  // ---- argument checks -----------------------------------------------------
  if (!positions.defined() || positions.dim() != 2 || positions.size(1) != 3) {
    throw std::invalid_argument("positions must have shape [N,3], got " +
                                (positions.defined() ? shape_str(positions) : "undefined"));
  }
  if (!at::isFloatingType(positions.scalar_type())) {
    throw std::invalid_argument(std::string("positions must be a floating-point tensor, got ") +
                                at::toString(positions.scalar_type()));
  }
  if (!cell.defined() || cell.dim() != 2 || cell.size(0) != 3 || cell.size(1) != 3) {
    throw std::invalid_argument("cell must have shape [3,3], got " +
                                (cell.defined() ? shape_str(cell) : "undefined"));
  }
  if (!at::isFloatingType(cell.scalar_type())) {
    throw std::invalid_argument(std::string("cell must be a floating-point tensor, got ") +
                                at::toString(cell.scalar_type()));
  }
  if (!(cutoff > 0.0) || !std::isfinite(cutoff)) {
    throw std::invalid_argument("cutoff must be > 0 and finite, got " + num_str(cutoff));
  }

  const at::Tensor pos_t = positions.detach().to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor cell_t = cell.detach().to(at::kCPU, at::kDouble).contiguous();
  const int64_t n_atoms = pos_t.size(0);
  const double* x = pos_t.data_ptr<double>();

  Mat3 cm{};
  {
    const double* cp = cell_t.data_ptr<double>();
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) cm[r][c] = cp[3 * r + c];
  }
  const Mat3 basis = binning_basis(cm, pbc);  // throws on degenerate periodic cell

  for (int64_t i = 0; i < 3 * n_atoms; ++i) {
    if (!std::isfinite(x[i])) {
      throw std::invalid_argument("positions must be finite, got " + num_str(x[i]) +
                                  " for atom " + std::to_string(i / 3));
    }
  }
  if (n_atoms == 0) return empty_list();

  // Cell vectors used for shift vectors: zero along non-periodic directions
  // (S is zero there; this also ignores NaN/garbage in an unused cell row).
  Mat3 lat{};
  for (int c = 0; c < 3; ++c) lat[c] = pbc[c] ? cm[c] : Vec3{0.0, 0.0, 0.0};

  const Mat3 recip = reciprocal(basis);
  Vec3 height{};  // distance between opposite faces per unit fractional coordinate
  for (int c = 0; c < 3; ++c) height[c] = 1.0 / norm(recip[c]);

  // ---- fractional coordinates, wrapping, extents -----------------------------
  std::vector<double> frac(3 * n_atoms);
  std::vector<int64_t> wrap(3 * n_atoms, 0);  // cs_i: x_i = wrapped_i + cs_i · cell
  Vec3 fmin{0.0, 0.0, 0.0}, fspan{1.0, 1.0, 1.0};
  for (int c = 0; c < 3; ++c) {
    double lo = std::numeric_limits<double>::infinity();
    double hi = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n_atoms; ++i) {
      double f = dot(Vec3{x[3 * i], x[3 * i + 1], x[3 * i + 2]}, recip[c]);
      if (pbc[c]) {
        const double fl = std::floor(f);
        if (!(std::abs(fl) < 1e15)) {
          throw std::invalid_argument(
              "positions must lie within 1e15 cell lengths of the origin along periodic "
              "directions, got fractional coordinate " + num_str(f) + " for atom " +
              std::to_string(i));
        }
        wrap[3 * i + c] = static_cast<int64_t>(fl);
        f -= fl;  // in [0,1] (1.0 possible by rounding; clamped below)
      } else {
        lo = std::min(lo, f);
        hi = std::max(hi, f);
      }
      frac[3 * i + c] = f;
    }
    if (!pbc[c]) {
      fmin[c] = lo;
      fspan[c] = hi - lo;
    }
  }

  // ---- bins ------------------------------------------------------------------
  // Bins about half a cutoff thick; each atom then scans only the bins that
  // intersect the slab |Δf_c| <= cutoff / height_c in every direction, i.e. a
  // box of ~2.5 cutoffs per side instead of 3 (any bin count is correct: the
  // scanned range is derived from the atom's own coordinate, not from nb).
  const double bin_target = 0.5 * cutoff;
  std::array<int64_t, 3> nb{};
  const double max_total = std::max<double>(64.0, 2.0 * static_cast<double>(n_atoms));
  for (int c = 0; c < 3; ++c) {
    const double extent = fspan[c] * height[c];  // Å along the face normal
    const double nd = std::floor(extent / bin_target);
    nb[c] = nd >= 1.0 ? static_cast<int64_t>(std::min(nd, max_total)) : 1;
  }
  // Limit memory / empty-bin scanning: at most ~2 bins per atom.
  while (static_cast<double>(nb[0]) * nb[1] * nb[2] > max_total) {
    int c = 0;
    for (int d = 1; d < 3; ++d)
      if (nb[d] > nb[c]) c = d;
    nb[c] = std::max<int64_t>(1, nb[c] / 2);
  }
  Vec3 inv_width{};  // bins per unit fractional coordinate
  Vec3 reach{};      // cutoff in fractional units (+ margin against rounding)
  for (int c = 0; c < 3; ++c) {
    inv_width[c] = pbc[c] ? static_cast<double>(nb[c])
                          : (nb[c] > 1 ? static_cast<double>(nb[c]) / fspan[c] : 0.0);
    reach[c] = cutoff / height[c] * (1.0 + 1e-6);
  }
  {
    // Guard against a cutoff absurdly larger than a tiny periodic cell (the
    // degeneracy test above is scale-free): the image search would not end.
    double images = 1.0;
    for (int c = 0; c < 3; ++c)
      if (pbc[c]) images *= 2.0 * reach[c] + 2.0;
    if (images > 1e9) {
      std::ostringstream os;
      os << "cutoff must span at most ~1e9 periodic images, got cutoff " << cutoff
         << " with cell heights (" << height[0] << ", " << height[1] << ", " << height[2] << ")";
      throw std::invalid_argument(os.str());
    }
  }

  // Wrapped Cartesian positions w_i = x_i - cs_i · cell, stored in bin order.
  const int64_t n_bins = nb[0] * nb[1] * nb[2];
  std::vector<int64_t> bin_of(n_atoms);
  std::vector<int64_t> bin_start(n_bins + 1, 0);
  std::vector<double> ufrac(3 * n_atoms);  // fractional coordinate measured from bin 0
  for (int64_t i = 0; i < n_atoms; ++i) {
    int64_t b3[3];
    for (int c = 0; c < 3; ++c) {
      const double u = pbc[c] ? frac[3 * i + c] : frac[3 * i + c] - fmin[c];
      ufrac[3 * i + c] = u;
      const double t = std::floor(u * inv_width[c]);
      b3[c] = t <= 0.0 ? 0
                       : (t >= static_cast<double>(nb[c] - 1) ? nb[c] - 1 : static_cast<int64_t>(t));
    }
    bin_of[i] = b3[0] + nb[0] * (b3[1] + nb[1] * b3[2]);
    ++bin_start[bin_of[i] + 1];
  }
  for (int64_t b = 0; b < n_bins; ++b) bin_start[b + 1] += bin_start[b];
  std::vector<int64_t> sorted_id(n_atoms);
  std::vector<int64_t> sorted_cs(3 * n_atoms);
  std::vector<double> sorted_w(3 * n_atoms);
  std::vector<double> wpos(3 * n_atoms);
  double max_abs_x = 0.0;
  int64_t max_cs = 0;
  {
    std::vector<int64_t> fill(bin_start.begin(), bin_start.end() - 1);
    for (int64_t i = 0; i < n_atoms; ++i) {
      const int64_t* cs = &wrap[3 * i];
      for (int c = 0; c < 3; ++c) {
        wpos[3 * i + c] = x[3 * i + c] - (static_cast<double>(cs[0]) * lat[0][c] +
                                          static_cast<double>(cs[1]) * lat[1][c] +
                                          static_cast<double>(cs[2]) * lat[2][c]);
        max_abs_x = std::max(max_abs_x, std::abs(x[3 * i + c]));
        max_cs = std::max(max_cs, std::abs(cs[c]));
      }
      const int64_t k = fill[bin_of[i]]++;  // ascending i within a bin
      sorted_id[k] = i;
      for (int c = 0; c < 3; ++c) {
        sorted_cs[3 * k + c] = cs[c];
        sorted_w[3 * k + c] = wpos[3 * i + c];
      }
    }
  }

  // Prefilter on wrapped positions, |w_j - w_i + s·cell|, with a margin far
  // above its rounding error; survivors are decided exactly below.
  double lat_sum = 0.0, max_reach = 0.0;
  for (int c = 0; c < 3; ++c) {
    for (int d = 0; d < 3; ++d) lat_sum += std::abs(lat[c][d]);
    if (pbc[c]) max_reach = std::max(max_reach, reach[c]);
  }
  const double scale = max_abs_x + (static_cast<double>(max_cs) + max_reach + 3.0) * lat_sum;
  const double pre_cut = cutoff + 1e-9 * (scale + cutoff);
  const double pre2 = pre_cut * pre_cut;
  const double cut2_hi = cutoff * cutoff * (1.0 + 1e-12);  // cheap test before sqrt

  // ---- search ---------------------------------------------------------------
  std::vector<int64_t> out_i, out_j, out_s;
  const size_t guess = static_cast<size_t>(n_atoms) * 16;
  out_i.reserve(guess);
  out_j.reserve(guess);
  out_s.reserve(3 * guess);
  std::vector<Edge> local;
  std::vector<int64_t> cand;

  for (int64_t i = 0; i < n_atoms; ++i) {
    local.clear();
    const double xi0 = x[3 * i], xi1 = x[3 * i + 1], xi2 = x[3 * i + 2];
    const double* wi = &wpos[3 * i];
    const int64_t* csi = &wrap[3 * i];
    // Unwrapped bin range t (= bin + image · nb) per direction for atom i.
    int64_t lo[3], hi[3];
    for (int c = 0; c < 3; ++c) {
      const double u = ufrac[3 * i + c];
      lo[c] = static_cast<int64_t>(std::floor((u - reach[c]) * inv_width[c]));
      hi[c] = static_cast<int64_t>(std::floor((u + reach[c]) * inv_width[c]));
      if (!pbc[c]) {  // no images: stay inside the bin grid
        lo[c] = std::max<int64_t>(lo[c], 0);
        hi[c] = std::min<int64_t>(hi[c], nb[c] - 1);
      }
    }
    for (int64_t tz = lo[2]; tz <= hi[2]; ++tz) {
      const int64_t sz = pbc[2] ? floor_div(tz, nb[2]) : 0;
      const int64_t bz = tz - sz * nb[2];
      for (int64_t ty = lo[1]; ty <= hi[1]; ++ty) {
        const int64_t sy = pbc[1] ? floor_div(ty, nb[1]) : 0;
        const int64_t by = ty - sy * nb[1];
        const int64_t row = nb[0] * (by + nb[1] * bz);
        // Runs of consecutive x bins with the same image are contiguous in memory.
        for (int64_t tx = lo[0]; tx <= hi[0];) {
          const int64_t sx = pbc[0] ? floor_div(tx, nb[0]) : 0;
          const int64_t bx = tx - sx * nb[0];
          const int64_t run_end = pbc[0] ? std::min(hi[0], (sx + 1) * nb[0] - 1) : hi[0];
          const int64_t bx_end = bx + (run_end - tx);
          tx = run_end + 1;
          const double fsx = static_cast<double>(sx), fsy = static_cast<double>(sy),
                       fsz = static_cast<double>(sz);
          // Centre of the search in the wrapped frame: w_i - s·cell.
          const double c0 = wi[0] - (fsx * lat[0][0] + fsy * lat[1][0] + fsz * lat[2][0]);
          const double c1 = wi[1] - (fsx * lat[0][1] + fsy * lat[1][1] + fsz * lat[2][1]);
          const double c2 = wi[2] - (fsx * lat[0][2] + fsy * lat[1][2] + fsz * lat[2][2]);
          const int64_t base0 = sx + csi[0], base1 = sy + csi[1], base2 = sz + csi[2];
          // Tight prefilter pass (keeps the hot loop in registers), then the
          // exact test on the few survivors.
          cand.clear();
          const int64_t k_end = bin_start[row + bx_end + 1];
          for (int64_t k = bin_start[row + bx]; k < k_end; ++k) {
            const double p0 = sorted_w[3 * k] - c0;
            const double p1 = sorted_w[3 * k + 1] - c1;
            const double p2 = sorted_w[3 * k + 2] - c2;
            if (p0 * p0 + p1 * p1 + p2 * p2 < pre2) cand.push_back(k);
          }
          for (const int64_t k : cand) {
            const int64_t j = sorted_id[k];
            const int64_t* csj = &sorted_cs[3 * k];
            const int64_t S0 = base0 - csj[0], S1 = base1 - csj[1], S2 = base2 - csj[2];
            if (j == i && S0 == 0 && S1 == 0 && S2 == 0) continue;
            const double fs0 = static_cast<double>(S0), fs1 = static_cast<double>(S1),
                         fs2 = static_cast<double>(S2);
            // Exact test, same arithmetic as positions[j] - positions[i] + shift_vectors.
            const double d0 =
                (x[3 * j] - xi0) + (fs0 * lat[0][0] + fs1 * lat[1][0] + fs2 * lat[2][0]);
            const double d1 =
                (x[3 * j + 1] - xi1) + (fs0 * lat[0][1] + fs1 * lat[1][1] + fs2 * lat[2][1]);
            const double d2 =
                (x[3 * j + 2] - xi2) + (fs0 * lat[0][2] + fs1 * lat[1][2] + fs2 * lat[2][2]);
            const double r2 = d0 * d0 + d1 * d1 + d2 * d2;
            if (r2 < cut2_hi && std::sqrt(r2) < cutoff) local.push_back(Edge{j, {S0, S1, S2}});
          }
        }
      }
    }
    std::sort(local.begin(), local.end());
    for (const Edge& e : local) {
      out_i.push_back(i);
      out_j.push_back(e.j);
      out_s.insert(out_s.end(), {e.s[0], e.s[1], e.s[2]});
    }
  }

  // ---- output tensors --------------------------------------------------------
  const int64_t n_edges = static_cast<int64_t>(out_i.size());
  NeighborList nl;
  nl.edge_index = at::empty({2, n_edges}, at::kLong);
  nl.shifts = at::empty({n_edges, 3}, at::kLong);
  nl.shift_vectors = at::empty({n_edges, 3}, at::kDouble);
  if (n_edges > 0) {
    int64_t* ei = nl.edge_index.data_ptr<int64_t>();
    std::memcpy(ei, out_i.data(), sizeof(int64_t) * n_edges);
    std::memcpy(ei + n_edges, out_j.data(), sizeof(int64_t) * n_edges);
    std::memcpy(nl.shifts.data_ptr<int64_t>(), out_s.data(), sizeof(int64_t) * 3 * n_edges);
    double* sv = nl.shift_vectors.data_ptr<double>();
    for (int64_t e = 0; e < n_edges; ++e) {
      const double fs0 = static_cast<double>(out_s[3 * e]);
      const double fs1 = static_cast<double>(out_s[3 * e + 1]);
      const double fs2 = static_cast<double>(out_s[3 * e + 2]);
      for (int c = 0; c < 3; ++c)
        sv[3 * e + c] = fs0 * lat[0][c] + fs1 * lat[1][c] + fs2 * lat[2][c];
    }
  }
  return nl;
}

}  // namespace crucible
