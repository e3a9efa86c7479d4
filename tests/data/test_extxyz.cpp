// Tests of the extxyz reader / writer against ASE 3.22 (the oracle is
// tests/data/oracles/ase_extxyz.py, run with CRUCIBLE_PYTHON).

#include "crucible/data/extxyz.h"

#include "crucible/common/error.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSource = CRUCIBLE_SOURCE_DIR;
const std::string kOracle = kSource + "/tests/data/oracles/ase_extxyz.py";
const std::string kBad = kSource + "/tests/data/bad/";
constexpr double kKcalPerMolToEv = 0.043364104241800934;

// A fresh temporary directory per test, removed afterwards.
class Extxyz : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("crucible_extxyz_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string tmp(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `text` to a temporary file and returns its path.
  std::string write_file(const std::string& name, const std::string& text) const {
    const std::string path = tmp(name);
    std::ofstream f(path, std::ios::binary);
    f << text;
    return path;
  }

  // Runs the ASE oracle with `args`. Throws (GoogleTest fails the test and
  // stops it) if it exits non-zero: the callers index its frames, and an
  // empty result read on would crash the suite (seen without python3-ase).
  json oracle(const std::string& args, const std::string& out_json) const {
    const std::string cmd = std::string(CRUCIBLE_PYTHON) + " " + kOracle + " " + args + " 2>" + tmp("oracle.err");
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::ifstream err(tmp("oracle.err"));
      std::stringstream ss;
      ss << err.rdbuf();
      throw std::runtime_error("oracle failed (" + std::to_string(rc) + "): " + cmd + "\n" + ss.str());
    }
    std::ifstream f(out_json);
    return json::parse(f);
  }

  fs::path dir_;
};

bool close(double a, double b, double rtol) {
  if (a == b) return true;
  return std::abs(a - b) <= rtol * std::max(std::abs(a), std::abs(b));
}

// Compares a [rows, cols] float64 tensor with a JSON nested list.
void expect_tensor(const at::Tensor& t, const json& expected, double rtol, const std::string& what) {
  ASSERT_TRUE(t.defined()) << what;
  ASSERT_EQ(t.scalar_type(), at::kDouble) << what;
  ASSERT_EQ(t.dim(), 2) << what;
  ASSERT_EQ(t.size(0), static_cast<int64_t>(expected.size())) << what;
  const at::Tensor c = t.contiguous();
  const double* p = c.data_ptr<double>();
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(t.size(1), static_cast<int64_t>(expected[i].size())) << what;
    for (size_t j = 0; j < expected[i].size(); ++j) {
      const double e = expected[i][j].get<double>();
      const double g = p[i * expected[i].size() + j];
      EXPECT_TRUE(close(g, e, rtol)) << what << "[" << i << "][" << j << "]: got " << g << ", expected " << e;
    }
  }
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Raw info text vs what ASE parsed it to (string, number, bool or a list).
void expect_info_value(const std::string& raw, const json& v, const std::string& what) {
  if (v.is_string()) {
    EXPECT_EQ(raw, v.get<std::string>()) << what;
  } else if (v.is_boolean()) {
    EXPECT_EQ(raw, v.get<bool>() ? "T" : "F") << what;
  } else if (v.is_number()) {
    EXPECT_TRUE(close(std::stod(raw), v.get<double>(), 1e-15)) << what << ": " << raw << " vs " << v;
  } else if (v.is_array()) {
    const auto parts = split_list(raw);
    ASSERT_EQ(parts.size(), v.size()) << what << ": " << raw;
    for (size_t i = 0; i < parts.size(); ++i) expect_info_value(parts[i], v[i], what);
  } else {
    ADD_FAILURE() << what << ": unexpected JSON " << v;
  }
}

// Compares read frames with the oracle's frame objects (see ase_extxyz.py).
void expect_frames(const std::vector<Structure>& got, const json& frames, double rtol, double energy_scale = 1.0,
                   double forces_scale = 1.0) {
  ASSERT_EQ(got.size(), frames.size());
  for (size_t f = 0; f < frames.size(); ++f) {
    const Structure& s = got[f];
    const json& e = frames[f];
    const std::string where = "frame " + std::to_string(f) + " (" + s.source + ")";
    // numbers
    ASSERT_TRUE(s.atomic_numbers.defined()) << where;
    ASSERT_EQ(s.atomic_numbers.scalar_type(), at::kLong) << where;
    ASSERT_EQ(s.atomic_numbers.dim(), 1) << where;
    const auto numbers = e["numbers"].get<std::vector<int64_t>>();
    ASSERT_EQ(s.num_atoms(), static_cast<int64_t>(numbers.size())) << where;
    for (size_t i = 0; i < numbers.size(); ++i) {
      EXPECT_EQ(s.atomic_numbers[static_cast<int64_t>(i)].item<int64_t>(), numbers[i]) << where << " atom " << i;
    }
    // positions, cell, pbc
    ASSERT_EQ(s.positions.dim(), 2) << where;
    EXPECT_EQ(s.positions.size(1), 3) << where;
    if (!numbers.empty()) expect_tensor(s.positions, e["positions"], rtol, where + " positions");
    ASSERT_EQ(s.cell.sizes(), (std::vector<int64_t>{3, 3})) << where;
    expect_tensor(s.cell, e["cell"], rtol, where + " cell");
    const auto pbc = e["pbc"].get<std::vector<bool>>();
    for (int k = 0; k < 3; ++k) EXPECT_EQ(s.pbc[k], pbc[k]) << where << " pbc " << k;
    // labels
    if (e["energy"].is_null()) {
      EXPECT_FALSE(s.energy.has_value()) << where;
    } else {
      ASSERT_TRUE(s.energy.has_value()) << where;
      EXPECT_TRUE(close(*s.energy, e["energy"].get<double>() * energy_scale, rtol))
          << where << " energy " << *s.energy << " vs " << e["energy"];
    }
    if (e["forces"].is_null()) {
      EXPECT_FALSE(s.forces.has_value()) << where;
    } else {
      ASSERT_TRUE(s.forces.has_value()) << where;
      json scaled = e["forces"];
      for (auto& row : scaled)
        for (auto& v : row) v = v.get<double>() * forces_scale;
      if (!numbers.empty()) expect_tensor(*s.forces, scaled, rtol, where + " forces");
    }
    if (e["stress"].is_null()) {
      EXPECT_FALSE(s.stress.has_value()) << where;
    } else {
      ASSERT_TRUE(s.stress.has_value()) << where;
      ASSERT_EQ(s.stress->sizes(), (std::vector<int64_t>{3, 3})) << where;
      expect_tensor(*s.stress, e["stress"], rtol, where + " stress");
    }
    EXPECT_EQ(s.config_type, e["config_type"].get<std::string>()) << where;
    EXPECT_EQ(s.weight, e["weights"]["config_weight"].get<double>()) << where;
    EXPECT_EQ(s.energy_weight, e["weights"]["config_energy_weight"].get<double>()) << where;
    EXPECT_EQ(s.forces_weight, e["weights"]["config_forces_weight"].get<double>()) << where;
    EXPECT_EQ(s.stress_weight, e["weights"]["config_stress_weight"].get<double>()) << where;
    EXPECT_EQ(s.info.size(), e["info"].size()) << where;
    for (const auto& [key, value] : e["info"].items()) {
      auto it = s.info.find(key);
      ASSERT_NE(it, s.info.end()) << where << " info " << key;
      expect_info_value(it->second, value, where + " info " + key);
    }
  }
}

// The message of the DataError read_extxyz throws, or "" if none.
std::string read_error(const std::string& path, const ExtxyzOptions& options = {}) {
  try {
    read_extxyz(path, options);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------
// Agreement with ASE.

TEST_F(Extxyz, SymbolsMatchAse) {
  const json symbols = oracle("symbols " + tmp("s.json"), tmp("s.json"));
  ASSERT_EQ(symbols.size(), 119u);
  for (int64_t z = 1; z <= 118; ++z) {
    const std::string sym = symbols[static_cast<size_t>(z)].get<std::string>();
    EXPECT_EQ(chemical_symbol(z), sym);
    EXPECT_EQ(atomic_number(sym), z);
  }
  EXPECT_EQ(atomic_number("TI"), 22);
  EXPECT_EQ(atomic_number("ti"), 22);
  EXPECT_THROW(atomic_number("Xx"), DataError);
  EXPECT_THROW(atomic_number(""), DataError);
  EXPECT_THROW(chemical_symbol(0), DataError);
  EXPECT_THROW(chemical_symbol(119), DataError);
}

TEST_F(Extxyz, TiAlTutorialMatchesAse) {
  // `force` column, 9-value virial (-> stress = -virial / volume), config_type,
  // Properties that change (tags:I:1 present in some frames only).
  const std::string path = kSource + "/data/alloy_TiAl/TiAl_tutorial.xyz";
  const json expected = oracle("read " + path + " " + tmp("tial.json"), tmp("tial.json"));
  const auto frames = read_extxyz(path);
  ASSERT_EQ(frames.size(), 329u);
  expect_frames(frames, expected["frames"], 1e-10);
  EXPECT_EQ(frames[0].source, path + ":2");
  EXPECT_EQ(frames[0].config_type, "FLD_TiAl");
  EXPECT_EQ(frames[0].info.at("spacegroup"), "P 1");
  EXPECT_TRUE(frames[0].forces.has_value());
  EXPECT_TRUE(frames[0].stress.has_value());
}

TEST_F(Extxyz, EthanolMatchesAse) {
  const std::string path = kSource + "/data/molecular_ethanol_rmd17/ethanol_reduced_100.xyz";
  const json expected = oracle("read " + path + " " + tmp("eth.json"), tmp("eth.json"));
  const auto frames = read_extxyz(path);
  ASSERT_EQ(frames.size(), 100u);
  expect_frames(frames, expected["frames"], 1e-10);
  for (const auto& s : frames) {
    EXPECT_FALSE(s.periodic());
    EXPECT_EQ(at::count_nonzero(s.cell).item<int64_t>(), 0);
    EXPECT_EQ(s.positions.scalar_type(), at::kDouble);
    EXPECT_EQ(s.atomic_numbers.scalar_type(), at::kLong);
  }
  EXPECT_EQ(frames[1].source, path + ":13");
}

TEST_F(Extxyz, EthanolKcalPerMolToEv) {
  const std::string path = kSource + "/data/molecular_ethanol_rmd17/ethanol_reduced_100.xyz";
  const json expected = oracle("read " + path + " " + tmp("eth.json"), tmp("eth.json"));
  ExtxyzOptions options;
  options.energy_unit = kKcalPerMolToEv;
  options.forces_unit = kKcalPerMolToEv;
  const auto frames = read_extxyz(path, options);
  expect_frames(frames, expected["frames"], 1e-10, kKcalPerMolToEv, kKcalPerMolToEv);
  const auto plain = read_extxyz(path);
  EXPECT_DOUBLE_EQ(*frames[0].energy, *plain[0].energy * kKcalPerMolToEv);
  EXPECT_TRUE(at::allclose(*frames[0].forces, *plain[0].forces * kKcalPerMolToEv, 1e-15, 0.0));
  EXPECT_TRUE(at::equal(frames[0].positions, plain[0].positions));
  EXPECT_NEAR(*frames[0].energy, -97079.92222178938 * kKcalPerMolToEv, 1e-9);
}

TEST_F(Extxyz, RandomAseFramesMatchAse) {
  // 150 frames written by ase.io.write: random N and Z, triclinic cells, all
  // 8 pbc combinations (incl. none, with and without a cell), energy, forces,
  // stress (ASE 3.22 writes it as 9 values), extra columns, info entries.
  const json expected =
      oracle("random " + tmp("r.xyz") + " " + tmp("r.json") + " 20240611 150", tmp("r.json"));
  const auto frames = read_extxyz(tmp("r.xyz"));
  ASSERT_EQ(frames.size(), 150u);
  expect_frames(frames, expected["frames"], 1e-10);
  int with_stress = 0, with_forces = 0, nonperiodic = 0;
  for (const auto& s : frames) {
    with_stress += s.stress.has_value();
    with_forces += s.forces.has_value();
    nonperiodic += !s.periodic();
  }
  EXPECT_GT(with_stress, 30);
  EXPECT_GT(with_forces, 50);
  EXPECT_GT(nonperiodic, 10);
}

TEST_F(Extxyz, HandWrittenVariantsMatchGroundTruthAndAse) {
  // 200 frames in published spellings (see `hand` in ase_extxyz.py); the
  // oracle checks its ground truth against ASE for every frame ASE can read.
  const json expected = oracle("hand " + tmp("h.xyz") + " " + tmp("h.json") + " 7 200", tmp("h.json"));
  EXPECT_GT(expected["ase_checked"].get<int>(), 100);
  const auto frames = read_extxyz(tmp("h.xyz"));
  expect_frames(frames, expected["frames"], 1e-12);
}

// ---------------------------------------------------------------------------
// Header variants.

TEST_F(Extxyz, PbcVariants) {
  const std::string lattice = R"(Lattice="4 0 0 0 5 0 0 0 6" )";
  const std::string atoms = "\nH 0 0 0\n";
  const std::vector<std::pair<std::string, std::array<bool, 3>>> cases = {
      {"1\n" + lattice + R"(Properties=species:S:1:pos:R:3 pbc="T T T")" + atoms, {true, true, true}},
      {"1\n" + lattice + "Properties=species:S:1:pos:R:3 pbc=[T, T, T]" + atoms, {true, true, true}},
      {"1\n" + lattice + R"(Properties=species:S:1:pos:R:3 pbc="T F T")" + atoms, {true, false, true}},
      {"1\n" + lattice + "Properties=species:S:1:pos:R:3 pbc=[F,F,T]" + atoms, {false, false, true}},
      {"1\n" + lattice + "Properties=species:S:1:pos:R:3 pbc=F" + atoms, {false, false, false}},
      {"1\n" + lattice + "Properties=species:S:1:pos:R:3" + atoms, {true, true, true}},
      {"1\nProperties=species:S:1:pos:R:3" + atoms, {false, false, false}},
      {"1\n" + std::string(R"(pbc="T T F" Properties=species:S:1:pos:R:3)") + atoms, {true, true, false}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto path = write_file("pbc" + std::to_string(i) + ".xyz", cases[i].first);
    const auto frames = read_extxyz(path);
    ASSERT_EQ(frames.size(), 1u) << cases[i].first;
    for (int k = 0; k < 3; ++k) EXPECT_EQ(frames[0].pbc[k], cases[i].second[k]) << cases[i].first;
  }
}

TEST_F(Extxyz, LatticeWithOddSpacingAndBrackets) {
  const std::vector<std::string> lattices = {
      R"(Lattice="1 2 3 4 5 6 7 8 9")",        R"(Lattice="  1  2	3 4 5   6 7 8 9  ")",
      R"(Lattice=[1, 2, 3, 4, 5, 6, 7, 8, 9])", R"(Lattice={1 2 3 4 5 6 7 8 9})",
      R"(Lattice='1 2 3 4 5 6 7 8 9')",        R"(Lattice = "1.0e0 2 3 4 5 6 7 8 9.")",
  };
  for (size_t i = 0; i < lattices.size(); ++i) {
    const auto path =
        write_file("l" + std::to_string(i) + ".xyz", "1\n" + lattices[i] + " Properties=species:S:1:pos:R:3\nH 0 0 0\n");
    const auto frames = read_extxyz(path);
    ASSERT_EQ(frames.size(), 1u);
    const at::Tensor expected = at::arange(1, 10, at::kDouble).reshape({3, 3});
    EXPECT_TRUE(at::equal(frames[0].cell, expected)) << lattices[i] << "\n" << frames[0].cell;
  }
}

TEST_F(Extxyz, QuotedValuesFlagsInfoAndWeights) {
  const auto path = write_file(
      "q.xyz",
      "2\n"
      R"(Lattice="3 0 0 0 3 0 0 0 3" Properties=species:S:1:pos:R:3 config_type="bulk fcc" comment="two words" )"
      R"(said="a \"quoted\" word" is_relaxed step=12 kpts=[2, 2, 2] spacegroup='P 1' config_weight=0.5 )"
      R"(config_energy_weight=2 config_forces_weight=3 config_stress_weight=0.25 url=a=b energy=-1.5)"
      "\nAl 0 0 0\nAl 1.5 1.5 1.5\n");
  const auto frames = read_extxyz(path);
  ASSERT_EQ(frames.size(), 1u);
  const Structure& s = frames[0];
  EXPECT_EQ(s.config_type, "bulk fcc");
  EXPECT_EQ(s.info.at("comment"), "two words");
  EXPECT_EQ(s.info.at("said"), R"(a "quoted" word)");
  EXPECT_EQ(s.info.at("is_relaxed"), "T");
  EXPECT_EQ(s.info.at("step"), "12");
  EXPECT_EQ(s.info.at("kpts"), "2, 2, 2");
  EXPECT_EQ(s.info.at("spacegroup"), "P 1");
  EXPECT_EQ(s.info.at("url"), "a=b");
  EXPECT_EQ(s.info.size(), 7u);
  EXPECT_EQ(s.weight, 0.5);
  EXPECT_EQ(s.energy_weight, 2.0);
  EXPECT_EQ(s.forces_weight, 3.0);
  EXPECT_EQ(s.stress_weight, 0.25);
  EXPECT_EQ(*s.energy, -1.5);
  EXPECT_FALSE(s.forces.has_value());
  EXPECT_FALSE(s.stress.has_value());
  EXPECT_EQ(s.source, path + ":2");

  // Defaults.
  const auto plain = read_extxyz(write_file("d.xyz", "1\n\nH 0 0 0\n"));
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].config_type, "Default");
  EXPECT_EQ(plain[0].weight, 1.0);
  EXPECT_TRUE(plain[0].info.empty());
  EXPECT_FALSE(plain[0].energy.has_value());
}

TEST_F(Extxyz, StressVoigtNineAndVirial) {
  const std::string head = R"(2
Lattice="2 0 0 0 4 0 0 0 5" Properties=species:S:1:pos:R:3 )";
  const std::string atoms = "\nH 0 0 0\nH 1 1 1\n";
  // Voigt xx yy zz yz xz xy.
  auto s = read_extxyz(write_file("v.xyz", head + R"(stress="1 2 3 4 5 6")" + atoms));
  const at::Tensor voigt = at::tensor({1., 6., 5., 6., 2., 4., 5., 4., 3.}, at::kDouble).reshape({3, 3});
  EXPECT_TRUE(at::equal(*s[0].stress, voigt)) << *s[0].stress;
  // 9 values, row-major.
  s = read_extxyz(write_file("n.xyz", head + R"(stress="1 6 5 6 2 4 5 4 3")" + atoms));
  EXPECT_TRUE(at::equal(*s[0].stress, voigt));
  // Virial: stress = -virial / volume (volume 40), 9 or 6 values.
  s = read_extxyz(write_file("w.xyz", head + R"(virial="40 0 0 0 80 0 0 0 -120")" + atoms));
  EXPECT_TRUE(at::allclose(*s[0].stress, at::diag(at::tensor({-1., -2., 3.}, at::kDouble)), 1e-15, 0.0));
  s = read_extxyz(write_file("w6.xyz", head + R"(virial="40 80 -120 0 0 40")" + atoms));
  EXPECT_TRUE(at::allclose(*s[0].stress, at::tensor({-1., -1., 0., -1., -2., 0., 0., 0., 3.}, at::kDouble).reshape({3, 3}),
                           1e-15, 0.0));
  EXPECT_FALSE(s[0].info.count("virial"));
  // An explicit stress wins over the virial, which is kept as info.
  s = read_extxyz(write_file("sw.xyz", head + R"(stress="1 2 3 4 5 6" virial="1 2 3 4 5 6 7 8 9")" + atoms));
  EXPECT_TRUE(at::equal(*s[0].stress, voigt));
  EXPECT_EQ(s[0].info.at("virial"), "1 2 3 4 5 6 7 8 9");
  // Units: stress_unit scales stress, energy_unit scales the virial.
  ExtxyzOptions options;
  options.stress_unit = 2.0;
  options.energy_unit = 10.0;
  s = read_extxyz(write_file("u.xyz", head + R"(stress="1 2 3 4 5 6")" + atoms), options);
  EXPECT_TRUE(at::equal(*s[0].stress, voigt * 2.0));
  s = read_extxyz(write_file("u2.xyz", head + R"(virial="40 0 0 0 80 0 0 0 -120")" + atoms), options);
  EXPECT_TRUE(at::allclose(*s[0].stress, at::diag(at::tensor({-10., -20., 30.}, at::kDouble)), 1e-15, 0.0));
}

TEST_F(Extxyz, ConfigurableKeysAndColumns) {
  const auto path = write_file("k.xyz",
                               "2\n"
                               R"(Lattice="2 0 0 0 4 0 0 0 5" Properties=species:S:1:pos:R:3:forces:R:3:REF_forces:R:3 )"
                               R"(energy=1 REF_energy=2 REF_stress="1 2 3 4 5 6" REF_virial="1 0 0 0 1 0 0 0 1")"
                               "\nH 0 0 0 1 1 1 2 2 2\nH 1 1 1 1 1 1 2 2 2\n");
  ExtxyzOptions options;
  options.energy_key = "REF_energy";
  options.forces_key = "REF_forces";
  options.stress_key = "REF_stress";
  options.virial_key = "REF_virial";
  const auto frames = read_extxyz(path, options);
  EXPECT_EQ(*frames[0].energy, 2.0);
  EXPECT_TRUE(at::equal(*frames[0].forces, at::full({2, 3}, 2.0, at::kDouble)));
  EXPECT_EQ(frames[0].stress->index({0, 1}).item<double>(), 6.0);
  EXPECT_EQ(frames[0].info.at("energy"), "1");
  EXPECT_EQ(frames[0].info.at("REF_virial"), "1 0 0 0 1 0 0 0 1");
  // Defaults: "forces" wins over "force"; "force" when there is no "forces".
  const auto both = read_extxyz(write_file("b.xyz",
                                           "1\nProperties=species:S:1:pos:R:3:force:R:3:forces:R:3\n"
                                           "H 0 0 0 1 1 1 2 2 2\n"
                                           "1\nProperties=force:R:3:pos:R:3:species:S:1\n"
                                           "3 3 3 0 0 0 H\n"));
  EXPECT_TRUE(at::equal(*both[0].forces, at::full({1, 3}, 2.0, at::kDouble)));
  EXPECT_TRUE(at::equal(*both[1].forces, at::full({1, 3}, 3.0, at::kDouble)));
  // An explicit forces key that a frame lacks: no forces, no error.
  options = {};
  options.forces_key = "dft_forces";
  EXPECT_FALSE(read_extxyz(write_file("n.xyz", "1\n\nH 0 0 0\n"), options)[0].forces.has_value());
}

TEST_F(Extxyz, SpeciesAndZColumnsChangingPerFrame) {
  const auto path = write_file("z.xyz",
                               "2\nProperties=Z:I:1:pos:R:3\n8 0 0 0\n1 0 0 1\n"
                               "2\nProperties=pos:R:3:species:S:1:Z:I:1 energy=3\n0 0 0 X 26\n1 1 1 X 29\n"
                               "1\nProperties=species:S:1:tags:I:1:pos:R:3:forces:R:3\r\nTI 5 1 2 3 4 5 6\r\n"
                               "\n\n\n");
  const auto frames = read_extxyz(path);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_TRUE(at::equal(frames[0].atomic_numbers, at::tensor({8, 1}, at::kLong)));
  EXPECT_TRUE(at::equal(frames[1].atomic_numbers, at::tensor({26, 29}, at::kLong)));  // Z wins, as ASE
  EXPECT_TRUE(at::equal(frames[2].atomic_numbers, at::tensor({22}, at::kLong)));
  EXPECT_TRUE(at::equal(frames[2].positions, at::tensor({1., 2., 3.}, at::kDouble).reshape({1, 3})));
  EXPECT_TRUE(at::equal(*frames[2].forces, at::tensor({4., 5., 6.}, at::kDouble).reshape({1, 3})));
  EXPECT_FALSE(frames[0].forces.has_value());
  EXPECT_EQ(frames[2].source, path + ":10");
  // Zero-atom frame.
  const auto empty = read_extxyz(write_file("e.xyz", "0\nenergy=1\n"));
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].num_atoms(), 0);
  EXPECT_EQ(empty[0].positions.sizes(), (std::vector<int64_t>{0, 3}));
}

// ---------------------------------------------------------------------------
// Malformed input: "<path>:<line>: <what> must be <expected>, got <actual>".

TEST_F(Extxyz, ErrorsNameFileLineAndExpectation) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated.xyz", ":1: frame must have 3 atom lines after the comment line, got only 16 bytes before end of "
                        "file, too few for them (4 columns need at least 8 bytes per line; truncated file or "
                        "wrong atom count?)"},
      {"huge_count.xyz",
       ":1: frame must have 99999999999 atom lines after the comment line, got only 8 bytes before "
       "end of file, too few for them (4 columns need at least 8 bytes per line; truncated file or wrong "
       "atom count?)"},
      {"no_comment.xyz", ":1: frame must have a comment line after the atom count, got end of file"},
      {"non_numeric.xyz", ":4: column 4 (pos) must be a number, got 'abc'"},
      {"non_numeric_force.xyz", ":3: column 7 (force) must be a number, got '1.0.0'"},
      {"missing_pos.xyz", ":2: Properties must contain pos:R:3, got 'species:S:1:forces:R:3'"},
      {"missing_species.xyz", ":2: Properties must contain species:S:1 or Z:I:1, got 'pos:R:3'"},
      {"short_pos.xyz", ":2: Properties column pos must be pos:R:3, got pos:R:2"},
      {"short_force.xyz", ":2: Properties column force must be force:R:3, got force:R:1"},
      {"bad_properties.xyz", ":2: Properties must be name:type:count triples, got 'species:S:1:pos:R'"},
      {"short_line.xyz", ":14: atom line must have 7 columns (species:S:1 pos:R:3 force:R:3), got 4"},
      {"count_too_large.xyz",
       ":5: atom line must have 4 columns (species:S:1 pos:R:3), got 1 (does the atom count 3 on line 1 match "
       "the number of atom lines?)"},
      {"count_too_small.xyz", ":4: atom count must be a non-negative integer, got 'H 1 0 0' (does the atom count "
                              "of the frame at <path>:2 match its number of atom lines?)"},
      {"count_not_integer.xyz", ":1: atom count must be a non-negative integer, got '2.5'"},
      {"count_word.xyz", ":1: atom count must be a non-negative integer, got 'two'"},
      {"unknown_element.xyz", ":4: species must be a chemical symbol, got 'Xx'"},
      {"bad_z.xyz", ":3: Z must be an atomic number in 1..118, got '0'"},
      {"lattice_count.xyz", ":2: Lattice must be 9 numbers, got 8"},
      {"lattice_text.xyz", ":2: Lattice must be numbers, got '1 0 0 0 1 0 0 0 one'"},
      {"stress_count.xyz", ":2: stress must be 6 (Voigt) or 9 numbers, got 4"},
      {"virial_count.xyz", ":2: virial must be 6 (Voigt) or 9 numbers, got 3"},
      {"virial_no_cell.xyz",
       ":2: virial must come with a Lattice of non-zero volume (stress = -virial / volume), got no Lattice"},
      {"bad_pbc.xyz", ":2: pbc must be 3 values of T or F, got 'T T'"},
      {"bad_energy.xyz", ":2: energy must be a number, got 'abc'"},
      {"bad_weight.xyz", ":2: config_weight must be a number, got 'heavy'"},
  };
  for (const auto& [file, message] : cases) {
    const std::string path = kBad + file;
    ASSERT_TRUE(fs::exists(path)) << path;
    std::string expected = path + message;
    const auto at = expected.find("<path>");
    if (at != std::string::npos) expected.replace(at, 6, path);
    EXPECT_EQ(read_error(path), expected) << file;
  }
  const std::string missing = tmp("missing.xyz");
  EXPECT_EQ(read_error(missing).rfind(missing + ": file must be readable, got ", 0), 0u) << read_error(missing);
}

// ---------------------------------------------------------------------------
// Writer.

// Random structures covering every field the writer emits.
std::vector<Structure> random_structures(int count, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<Structure> out;
  for (int i = 0; i < count; ++i) {
    Structure s;
    const int64_t n = 1 + i % 13;
    s.positions = at::randn({n, 3}, gen, f64) * 5.0;
    s.atomic_numbers = at::randint(1, 119, {n}, gen, at::TensorOptions().dtype(at::kLong));
    s.pbc = {(i & 1) != 0, (i & 2) != 0, (i & 4) != 0};
    s.cell = (i % 8 == 0) ? at::zeros({3, 3}, f64)
                          : at::eye(3, f64) * 6.0 + at::randn({3, 3}, gen, f64) * 0.7;
    if (i % 5 != 1) s.energy = at::randn({1}, gen, f64).item<double>() * 1e3;
    if (i % 4 != 2) s.forces = at::randn({n, 3}, gen, f64);
    if (i % 3 != 0) {
      const at::Tensor a = at::randn({3, 3}, gen, f64) * 1e-2;
      s.stress = a + a.t();  // ASE stores stress as Voigt: symmetric
    }
    if (i % 2) s.config_type = (i % 4 == 1) ? "surface slab" : "bulk";
    if (i % 6 == 5) {
      s.weight = 0.5;
      s.energy_weight = 2.0;
      s.forces_weight = 1.0 / 3.0;
      s.stress_weight = 0.0;
    }
    s.info["note"] = "frame " + std::to_string(i);
    if (i % 3 == 1) s.info["said"] = R"(a "quoted" word)";
    if (i % 4 == 3) s.info["step"] = std::to_string(i * 7);
    out.push_back(std::move(s));
  }
  return out;
}

// Structure -> the oracle's frame object.
json frame_json(const Structure& s) {
  auto mat = [](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    json rows = json::array();
    for (int64_t i = 0; i < c.size(0); ++i) {
      json row = json::array();
      for (int64_t j = 0; j < c.size(1); ++j) row.push_back(c[i][j].item<double>());
      rows.push_back(row);
    }
    return rows;
  };
  json f;
  json numbers = json::array();
  for (int64_t i = 0; i < s.num_atoms(); ++i) numbers.push_back(s.atomic_numbers[i].item<int64_t>());
  f["numbers"] = numbers;
  f["positions"] = mat(s.positions);
  f["cell"] = mat(s.cell);
  f["pbc"] = {s.pbc[0], s.pbc[1], s.pbc[2]};
  f["energy"] = s.energy ? json(*s.energy) : json(nullptr);
  f["forces"] = s.forces ? mat(*s.forces) : json(nullptr);
  f["stress"] = s.stress ? mat(*s.stress) : json(nullptr);
  f["config_type"] = s.config_type;
  f["weights"] = {{"config_weight", s.weight},
                  {"config_energy_weight", s.energy_weight},
                  {"config_forces_weight", s.forces_weight},
                  {"config_stress_weight", s.stress_weight}};
  f["info"] = s.info;
  return f;
}

TEST_F(Extxyz, WriterAseReadsBack) {
  const auto structures = random_structures(48, 1234);
  const std::string path = tmp("w.xyz");
  write_extxyz(path, structures);
  const json ase_read = oracle("read " + path + " " + tmp("w.json"), tmp("w.json"));
  // ASE read every value exactly (17 significant digits round-trip float64).
  json expected = json::array();
  for (const auto& s : structures) expected.push_back(frame_json(s));
  ASSERT_EQ(ase_read["frames"].size(), expected.size());
  for (size_t f = 0; f < expected.size(); ++f) {
    const json& a = ase_read["frames"][f];
    const json& e = expected[f];
    for (const char* key : {"numbers", "positions", "cell", "pbc", "energy", "forces", "config_type", "weights"}) {
      EXPECT_EQ(a[key], e[key]) << "frame " << f << " " << key;
    }
    if (e["stress"].is_null()) {
      EXPECT_TRUE(a["stress"].is_null()) << f;
    } else {
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
          EXPECT_EQ(a["stress"][i][j].get<double>(), e["stress"][i][j].get<double>()) << f;
    }
    EXPECT_EQ(a["info"]["note"], e["info"]["note"]) << f;
    if (e["info"].contains("said")) EXPECT_EQ(a["info"]["said"], e["info"]["said"]) << f;
    if (e["info"].contains("step")) EXPECT_EQ(a["info"]["step"].get<int>(), std::stoi(e["info"]["step"].get<std::string>()));
  }
}

TEST_F(Extxyz, WriterRoundTripIsExact) {
  const auto structures = random_structures(40, 99);
  const std::string path = tmp("rt.xyz");
  write_extxyz(path, structures);
  const auto back = read_extxyz(path);
  json expected = json::array();
  for (const auto& s : structures) expected.push_back(frame_json(s));
  expect_frames(back, expected, 0.0);  // bit-exact
  for (size_t i = 0; i < back.size(); ++i) EXPECT_EQ(back[i].info, structures[i].info) << i;

  // The header it writes.
  std::ifstream f(path);
  std::string count, header;
  std::getline(f, count);
  std::getline(f, header);
  EXPECT_EQ(count, "1");
  EXPECT_NE(header.find("Properties=species:S:1:pos:R:3:forces:R:3 energy="), std::string::npos) << header;
  EXPECT_NE(header.find(R"(pbc="F F F" config_type=Default note="frame 0")"), std::string::npos) << header;
  EXPECT_EQ(header.find("Lattice"), std::string::npos) << header;  // zero cell

  EXPECT_THROW(write_extxyz(tmp("no/such/dir/x.xyz"), structures), DataError);
}

// Large frames round-trip exactly (speed is measured by bench/, not here).
TEST_F(Extxyz, HundredThousandAtomFramesRoundTrip) {
  Structure s;
  const int64_t n = 100000;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  s.positions = at::rand({n, 3}, f64) * 100.0;
  s.atomic_numbers = at::randint(1, 90, {n}, at::TensorOptions().dtype(at::kLong));
  s.cell = at::eye(3, f64) * 100.0;
  s.pbc = {true, true, true};
  s.forces = at::randn({n, 3}, f64);
  s.energy = -12345.678;
  const std::string path = tmp("big.xyz");
  write_extxyz(path, {s, s});
  const auto frames = read_extxyz(path);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_TRUE(at::equal(frames[1].positions, s.positions));
  EXPECT_TRUE(at::equal(*frames[1].forces, *s.forces));
  EXPECT_TRUE(at::equal(frames[1].atomic_numbers, s.atomic_numbers));
}

}  // namespace
}  // namespace crucible
