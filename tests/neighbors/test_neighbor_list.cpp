// Tests for crucible::build_neighbor_list.
//
// Reference: ase.neighborlist.neighbor_list("ijS") via the oracle script
// tests/neighbors/oracles/ase_neighbor_cases.py, run with CRUCIBLE_PYTHON
// (a Python with python3-ase). The oracle writes seeded random triclinic
// cases (all 8 pbc combinations, atoms outside the cell, cutoffs up to twice
// the shortest cell height, no pair within 1e-6 Å of the cutoff) plus a few
// hand-made ones to a temporary JSON file that these tests read.

#include "crucible/neighbors/neighbor_list.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace crucible {
namespace {

using Triple = std::array<int64_t, 5>;  // i, j, S0, S1, S2

struct Case {
  std::string name;
  at::Tensor positions;  // [N,3] float64
  at::Tensor cell;       // [3,3] float64
  std::array<bool, 3> pbc{};
  double cutoff = 0.0;
  std::vector<Triple> expected;  // sorted (i, j, S)
};

at::Tensor to_tensor(const std::vector<double>& v, int64_t rows) {
  return at::from_blob(const_cast<double*>(v.data()), {rows, 3}, at::kDouble).clone();
}

std::vector<Case> load_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open oracle output " + path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& jc : doc.at("cases")) {
    Case c;
    c.name = jc.at("name").get<std::string>();
    std::vector<double> pos;
    for (const auto& row : jc.at("positions"))
      for (const auto& v : row) pos.push_back(v.get<double>());
    c.positions = to_tensor(pos, static_cast<int64_t>(pos.size() / 3));
    std::vector<double> cell;
    for (const auto& row : jc.at("cell"))
      for (const auto& v : row) cell.push_back(v.get<double>());
    c.cell = to_tensor(cell, 3);
    for (int k = 0; k < 3; ++k) c.pbc[k] = jc.at("pbc")[k].get<bool>();
    c.cutoff = jc.at("cutoff").get<double>();
    const auto& ji = jc.at("i");
    const auto& jj = jc.at("j");
    const auto& js = jc.at("S");
    for (size_t e = 0; e < ji.size(); ++e) {
      c.expected.push_back({ji[e].get<int64_t>(), jj[e].get<int64_t>(), js[e][0].get<int64_t>(),
                            js[e][1].get<int64_t>(), js[e][2].get<int64_t>()});
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// Runs the ASE oracle and caches the parsed cases for this process. The JSON
// is also cached in the working directory (the build tree), keyed by a hash of
// the oracle script, so ctest's one-process-per-test runs pay for ASE once.
const std::vector<Case>& ase_cases() {
  static const std::vector<Case> cases = [] {
    const std::string script =
        std::string(CRUCIBLE_SOURCE_DIR) + "/tests/neighbors/oracles/ase_neighbor_cases.py";
    std::ifstream in(script);
    if (!in) throw std::runtime_error("cannot read oracle script " + script);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ostringstream name;
    name << "ase_neighbor_cases_s1234_n64_" << std::hex << std::hash<std::string>{}(text)
         << ".json";
    const std::filesystem::path cache = std::filesystem::current_path() / name.str();
    if (!std::filesystem::exists(cache)) {
      const std::string tmp = cache.string() + ".tmp" + std::to_string(::getpid());
      const std::string cmd = std::string("'") + CRUCIBLE_PYTHON + "' '" + script +
                              "' --seed 1234 --ncases 64 --out '" + tmp + "'";
      const int rc = std::system(cmd.c_str());
      if (rc != 0) {
        std::remove(tmp.c_str());
        throw std::runtime_error("oracle failed (rc " + std::to_string(rc) + "): " + cmd);
      }
      std::filesystem::rename(tmp, cache);  // atomic: concurrent tests never see a partial file
    }
    return load_cases(cache.string());
  }();
  return cases;
}

std::vector<Triple> triples(const NeighborList& nl) {
  const int64_t n = nl.num_edges();
  auto ei = nl.edge_index.accessor<int64_t, 2>();
  auto s = nl.shifts.accessor<int64_t, 2>();
  std::vector<Triple> out(n);
  for (int64_t e = 0; e < n; ++e) out[e] = {ei[0][e], ei[1][e], s[e][0], s[e][1], s[e][2]};
  return out;
}

std::string triple_str(const Triple& t) {
  std::ostringstream os;
  os << "(i=" << t[0] << ", j=" << t[1] << ", S=[" << t[2] << "," << t[3] << "," << t[4] << "])";
  return os.str();
}

// Exact comparison with a readable first difference.
::testing::AssertionResult same_edges(const std::vector<Triple>& got,
                                      const std::vector<Triple>& want) {
  const size_t n = std::min(got.size(), want.size());
  for (size_t e = 0; e < n; ++e) {
    if (got[e] != want[e]) {
      return ::testing::AssertionFailure() << "first difference at edge " << e << ": got "
                                           << triple_str(got[e]) << ", ASE "
                                           << triple_str(want[e]) << " (E got " << got.size()
                                           << ", ASE " << want.size() << ")";
    }
  }
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "edge count differs: got " << got.size() << ", ASE "
                                         << want.size();
  }
  return ::testing::AssertionSuccess();
}

std::string pbc_str(const std::array<bool, 3>& p) {
  return std::string(p[0] ? "T" : "F") + (p[1] ? "T" : "F") + (p[2] ? "T" : "F");
}

// Distance between opposite faces of each lattice direction.
std::array<double, 3> heights(const at::Tensor& cell) {
  const at::Tensor rec = at::linalg_inv(cell).t();
  std::array<double, 3> h{};
  for (int c = 0; c < 3; ++c) h[c] = 1.0 / rec[c].norm().item<double>();
  return h;
}

template <class F>
void expect_throws_with(F&& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument containing \"" << fragment << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << fragment << "\"";
  }
}

// Conventional fcc supercell (rep^3 cubes of 4 atoms), rattled.
std::pair<at::Tensor, at::Tensor> fcc(int rep, double a, double rattle, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> noise(0.0, rattle);
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
  at::Tensor cell = at::eye(3, at::kDouble) * (a * rep);
  return {to_tensor(pos, static_cast<int64_t>(pos.size() / 3)), cell};
}

// O(N^2 * images) reference: every (i, j, S) with |x_j - x_i + S·cell| < rc.
std::vector<Triple> brute_force(const at::Tensor& pos, const at::Tensor& cell,
                                std::array<bool, 3> pbc, double rc) {
  const int64_t n = pos.size(0);
  const auto h = heights(cell);
  auto x = pos.accessor<double, 2>();
  auto L = cell.accessor<double, 2>();
  const at::Tensor frac = at::linalg_solve(cell.t(), pos.t()).t().contiguous();
  auto f = frac.accessor<double, 2>();
  std::vector<Triple> out;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      int64_t lo[3], hi[3];
      for (int c = 0; c < 3; ++c) {
        if (!pbc[c]) {
          lo[c] = hi[c] = 0;
          continue;
        }
        const double center = f[i][c] - f[j][c];
        const double reach = rc / h[c] + 1.0;
        lo[c] = static_cast<int64_t>(std::floor(center - reach));
        hi[c] = static_cast<int64_t>(std::ceil(center + reach));
      }
      for (int64_t s0 = lo[0]; s0 <= hi[0]; ++s0)
        for (int64_t s1 = lo[1]; s1 <= hi[1]; ++s1)
          for (int64_t s2 = lo[2]; s2 <= hi[2]; ++s2) {
            if (i == j && s0 == 0 && s1 == 0 && s2 == 0) continue;
            double d2 = 0.0;
            for (int c = 0; c < 3; ++c) {
              const double d = x[j][c] - x[i][c] + (s0 * L[0][c] + s1 * L[1][c] + s2 * L[2][c]);
              d2 += d * d;
            }
            if (std::sqrt(d2) < rc) out.push_back({i, j, s0, s1, s2});
          }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------------------
// Agreement with ASE
// ---------------------------------------------------------------------------

TEST(NeighborListAse, MatchesAseOnRandomTriclinicCells) {
  const auto& cases = ase_cases();
  int n_random = 0;
  std::set<std::string> combos;
  double max_ratio = 0.0;  // cutoff / shortest periodic height
  int64_t total_edges = 0;
  for (const Case& c : cases) {
    if (c.name.rfind("random_", 0) != 0) continue;
    ++n_random;
    combos.insert(pbc_str(c.pbc));
    const NeighborList nl = build_neighbor_list(c.positions, c.cell, c.pbc, c.cutoff);
    const auto got = triples(nl);
    total_edges += static_cast<int64_t>(got.size());
    EXPECT_TRUE(same_edges(got, c.expected)) << c.name << " (pbc " << pbc_str(c.pbc)
                                             << ", cutoff " << c.cutoff << ")";
    if (c.pbc[0] && c.pbc[1] && c.pbc[2]) {
      const auto h = heights(c.cell);
      max_ratio = std::max(max_ratio, c.cutoff / *std::min_element(h.begin(), h.end()));
    }
  }
  EXPECT_GE(n_random, 50);
  EXPECT_EQ(combos.size(), 8u) << "all 8 pbc combinations must appear";
  EXPECT_GT(max_ratio, 1.5) << "some cutoff must exceed the cell height (several images)";
  EXPECT_GT(total_edges, 1000);
}

TEST(NeighborListAse, MatchesAseOnBulkSlabAndSelfImages) {
  int n = 0;
  for (const Case& c : ase_cases()) {
    if (c.name.rfind("cu_fcc_", 0) != 0 && c.name != "slab_zero_c" &&
        c.name != "single_atom_images")
      continue;
    ++n;
    const NeighborList nl = build_neighbor_list(c.positions, c.cell, c.pbc, c.cutoff);
    EXPECT_TRUE(same_edges(triples(nl), c.expected)) << c.name;
  }
  EXPECT_EQ(n, 5);
}

TEST(NeighborListAse, IsolatedMoleculeMatchesAse) {
  int n = 0;
  for (const Case& c : ase_cases()) {
    if (c.name.rfind("ethanol_no_cell_", 0) != 0) continue;
    ++n;
    ASSERT_EQ(c.cell.abs().sum().item<double>(), 0.0);
    ASSERT_FALSE(c.pbc[0] || c.pbc[1] || c.pbc[2]);
    const NeighborList nl = build_neighbor_list(c.positions, c.cell, c.pbc, c.cutoff);
    EXPECT_TRUE(same_edges(triples(nl), c.expected)) << c.name;
    EXPECT_EQ(nl.shifts.abs().sum().item<int64_t>(), 0);
  }
  EXPECT_EQ(n, 2);
  // The 5 Å list of ethanol (9 atoms, < 5 Å across) is every ordered pair.
  for (const Case& c : ase_cases())
    if (c.name == "ethanol_no_cell_5.0") EXPECT_EQ(c.expected.size(), 9u * 8u);
}

// ---------------------------------------------------------------------------
// Invariants (checked on every oracle case)
// ---------------------------------------------------------------------------

TEST(NeighborListInvariants, NoSelfPairWithZeroShift) {
  for (const Case& c : ase_cases()) {
    for (const Triple& t : triples(build_neighbor_list(c.positions, c.cell, c.pbc, c.cutoff))) {
      EXPECT_FALSE(t[0] == t[1] && t[2] == 0 && t[3] == 0 && t[4] == 0)
          << c.name << ": " << triple_str(t);
    }
  }
}

TEST(NeighborListInvariants, EveryPairHasItsReverse) {
  for (const Case& c : ase_cases()) {
    const auto got = triples(build_neighbor_list(c.positions, c.cell, c.pbc, c.cutoff));
    const std::set<Triple> all(got.begin(), got.end());
    for (const Triple& t : got) {
      const Triple rev{t[1], t[0], -t[2], -t[3], -t[4]};
      EXPECT_TRUE(all.count(rev)) << c.name << ": " << triple_str(t) << " has no reverse";
    }
  }
}

TEST(NeighborListInvariants, ShiftVectorsEqualShiftsTimesCellAndDistancesBelowCutoff) {
  for (const Case& c : ase_cases()) {
    const NeighborList nl = build_neighbor_list(c.positions, c.cell, c.pbc, c.cutoff);
    ASSERT_EQ(nl.shift_vectors.scalar_type(), at::kDouble);
    if (nl.num_edges() == 0) continue;
    const at::Tensor expected = at::matmul(nl.shifts.to(at::kDouble), c.cell);
    EXPECT_TRUE(at::allclose(nl.shift_vectors, expected, 0.0, 1e-12)) << c.name;
    const at::Tensor d = c.positions.index_select(0, nl.edge_index[1]) -
                         c.positions.index_select(0, nl.edge_index[0]) + nl.shift_vectors;
    EXPECT_LT(d.norm(2, {1}).max().item<double>(), c.cutoff) << c.name;
    // Non-periodic directions never carry a shift.
    for (int k = 0; k < 3; ++k)
      if (!c.pbc[k]) EXPECT_EQ(nl.shifts.select(1, k).abs().max().item<int64_t>(), 0) << c.name;
  }
}

TEST(NeighborListInvariants, OutputShapesDtypesAndOrder) {
  for (const Case& c : ase_cases()) {
    const NeighborList nl = build_neighbor_list(c.positions, c.cell, c.pbc, c.cutoff);
    const int64_t e = nl.num_edges();
    EXPECT_EQ(nl.edge_index.sizes(), (std::vector<int64_t>{2, e}));
    EXPECT_EQ(nl.shifts.sizes(), (std::vector<int64_t>{e, 3}));
    EXPECT_EQ(nl.shift_vectors.sizes(), (std::vector<int64_t>{e, 3}));
    EXPECT_EQ(nl.edge_index.scalar_type(), at::kLong);
    EXPECT_EQ(nl.shifts.scalar_type(), at::kLong);
    const auto got = triples(nl);
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end())) << c.name;
    EXPECT_TRUE(std::adjacent_find(got.begin(), got.end()) == got.end()) << c.name << " duplicates";
  }
}

// ---------------------------------------------------------------------------
// Independent brute-force check on larger systems
// ---------------------------------------------------------------------------

TEST(NeighborListBruteForce, MatchesBruteForceOnSkewedCellsAllPbc) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> u(-0.3, 1.3);
  const double cell_data[9] = {9.0, 0.0, 0.0, 3.1, 8.2, 0.0, -2.4, 1.7, 7.6};
  const at::Tensor cell = at::from_blob(const_cast<double*>(cell_data), {3, 3}, at::kDouble).clone();
  const int64_t n = 150;
  std::vector<double> frac(3 * n);
  for (double& v : frac) v = u(gen);
  const at::Tensor pos = at::matmul(to_tensor(frac, n), cell);
  for (int mask = 0; mask < 8; ++mask) {
    const std::array<bool, 3> pbc{bool(mask & 1), bool(mask & 2), bool(mask & 4)};
    for (double rc : {2.5, 6.0, 9.5}) {
      const auto got = triples(build_neighbor_list(pos, cell, pbc, rc));
      EXPECT_TRUE(same_edges(got, brute_force(pos, cell, pbc, rc)))
          << "pbc " << pbc_str(pbc) << " rc " << rc;
    }
  }
}

// ---------------------------------------------------------------------------
// Conversions and edge cases
// ---------------------------------------------------------------------------

TEST(NeighborListEdgeCases, EmptyStructureGivesEmptyList) {
  const NeighborList nl =
      build_neighbor_list(at::zeros({0, 3}, at::kDouble), at::eye(3, at::kDouble) * 5.0,
                          {true, true, true}, 3.0);
  EXPECT_EQ(nl.num_edges(), 0);
  EXPECT_EQ(nl.edge_index.sizes(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(nl.shifts.sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(nl.shift_vectors.sizes(), (std::vector<int64_t>{0, 3}));
}

TEST(NeighborListEdgeCases, Float32InputsAreConverted) {
  auto [pos, cell] = fcc(2, 3.6, 0.05, 3);
  const NeighborList ref = build_neighbor_list(pos.to(at::kFloat).to(at::kDouble),
                                               cell.to(at::kFloat).to(at::kDouble),
                                               {true, true, true}, 4.0);
  const NeighborList f32 =
      build_neighbor_list(pos.to(at::kFloat), cell.to(at::kFloat), {true, true, true}, 4.0);
  EXPECT_TRUE(same_edges(triples(f32), triples(ref)));
  EXPECT_EQ(f32.shift_vectors.scalar_type(), at::kDouble);
}

TEST(NeighborListEdgeCases, NonPeriodicCellVectorIsIgnored) {
  // pbc F along c: any c vector (zero, parallel to a, huge) gives the same list.
  auto [pos, cell] = fcc(2, 3.6, 0.1, 5);
  const auto ref = triples(build_neighbor_list(pos, cell, {true, true, false}, 5.0));
  at::Tensor zero_c = cell.clone();
  zero_c[2].zero_();
  at::Tensor parallel_c = cell.clone();
  parallel_c[2] = cell[0] * 2.0;
  EXPECT_TRUE(same_edges(triples(build_neighbor_list(pos, zero_c, {true, true, false}, 5.0)), ref));
  EXPECT_TRUE(
      same_edges(triples(build_neighbor_list(pos, parallel_c, {true, true, false}, 5.0)), ref));
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

TEST(NeighborListErrors, RejectsNonPositiveOrNonFiniteCutoff) {
  const at::Tensor pos = at::zeros({2, 3}, at::kDouble);
  const at::Tensor cell = at::eye(3, at::kDouble) * 4.0;
  expect_throws_with([&] { build_neighbor_list(pos, cell, {true, true, true}, 0.0); },
                     "cutoff must be > 0 and finite, got 0");
  expect_throws_with([&] { build_neighbor_list(pos, cell, {true, true, true}, -1.5); },
                     "cutoff must be > 0 and finite, got -1.5");
  expect_throws_with([&] { build_neighbor_list(pos, cell, {true, true, true}, std::nan("")); },
                     "cutoff must be > 0 and finite, got nan");
  expect_throws_with(
      [&] { build_neighbor_list(pos, cell, {true, true, true}, INFINITY); },
      "cutoff must be > 0 and finite, got inf");
}

TEST(NeighborListErrors, RejectsWrongShapes) {
  const at::Tensor cell = at::eye(3, at::kDouble) * 4.0;
  const std::array<bool, 3> pbc{true, true, true};
  expect_throws_with([&] { build_neighbor_list(at::zeros({4, 2}, at::kDouble), cell, pbc, 3.0); },
                     "positions must have shape [N,3], got [4,2]");
  expect_throws_with([&] { build_neighbor_list(at::zeros({4}, at::kDouble), cell, pbc, 3.0); },
                     "positions must have shape [N,3], got [4]");
  expect_throws_with(
      [&] { build_neighbor_list(at::zeros({1, 4, 3}, at::kDouble), cell, pbc, 3.0); },
      "positions must have shape [N,3], got [1,4,3]");
  const at::Tensor pos = at::zeros({4, 3}, at::kDouble);
  expect_throws_with([&] { build_neighbor_list(pos, at::zeros({3}, at::kDouble), pbc, 3.0); },
                     "cell must have shape [3,3], got [3]");
  expect_throws_with([&] { build_neighbor_list(pos, at::zeros({2, 3}, at::kDouble), pbc, 3.0); },
                     "cell must have shape [3,3], got [2,3]");
  expect_throws_with([&] { build_neighbor_list(at::zeros({4, 3}, at::kLong), cell, pbc, 3.0); },
                     "positions must be a floating-point tensor, got Long");
}

TEST(NeighborListErrors, RejectsDegeneratePeriodicCellAndNonFinitePositions) {
  const at::Tensor pos = at::zeros({2, 3}, at::kDouble);
  at::Tensor cell = at::eye(3, at::kDouble) * 4.0;
  cell[1].zero_();
  expect_throws_with([&] { build_neighbor_list(pos, cell, {true, true, true}, 3.0); },
                     "cell vector b must be non-zero and finite along a periodic direction");
  // Fine when b is not periodic.
  EXPECT_NO_THROW(build_neighbor_list(pos, cell, {true, false, true}, 3.0));
  at::Tensor flat = at::eye(3, at::kDouble) * 4.0;
  flat[2] = flat[0] + flat[1];  // coplanar
  expect_throws_with([&] { build_neighbor_list(pos, flat, {true, true, true}, 3.0); },
                     "cell must be non-degenerate along periodic directions");
  at::Tensor par = at::eye(3, at::kDouble) * 4.0;
  par[1] = par[0] * 2.0;
  expect_throws_with([&] { build_neighbor_list(pos, par, {true, true, false}, 3.0); },
                     "periodic cell vectors a and b must be linearly independent");
  expect_throws_with([&] { build_neighbor_list(pos, at::eye(3, at::kDouble) * 1e-4,
                                               {true, true, true}, 5.0); },
                     "cutoff must span at most ~1e9 periodic images");
  at::Tensor bad = at::zeros({2, 3}, at::kDouble);
  bad[1][2] = std::nan("");
  expect_throws_with([&] { build_neighbor_list(bad, at::eye(3, at::kDouble) * 4.0,
                                               {false, false, false}, 3.0); },
                     "positions must be finite, got nan for atom 1");
}

// ---------------------------------------------------------------------------
// Timing (targets: 32 atoms @ 5 Å well under 1 ms; 16384 atoms well under 1 s)
// ---------------------------------------------------------------------------

// fcc shells within 5 Å at a = 3.61 Å: 12 + 6 + 24 = 42 neighbors per atom,
// for a small and a large cell (speed is measured in bench/, not here).
TEST(NeighborListFcc, FortyTwoNeighborsPerAtomSmallAndLarge) {
  auto [pos32, cell32] = fcc(2, 3.61, 0.01, 11);  // 32 atoms, 7.22 Å cube
  ASSERT_EQ(pos32.size(0), 32);
  EXPECT_EQ(build_neighbor_list(pos32, cell32, {true, true, true}, 5.0).num_edges(), 32 * 42);
  auto [posL, cellL] = fcc(16, 3.61, 0.01, 12);  // 16384 atoms, 57.8 Å cube
  ASSERT_EQ(posL.size(0), 16384);
  EXPECT_EQ(build_neighbor_list(posL, cellL, {true, true, true}, 5.0).num_edges(), 16384 * 42);
}

}  // namespace
}  // namespace crucible
