// Issue 46 through the real binary: `crucible import mace` of the fixture
// models (TorchScript alone, and .pt + hyper-parameters), then `crucible
// evaluate --write` on the fixture structures equals MACE's own predictions
// (float64 1e-10 relative, the float32 model in float32 1e-5), `crucible
// info` shows the origin, and bad input is refused without writing.

#include "crucible/data/extxyz.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>

namespace crucible {
namespace {

using namespace e2e;

const fs::path kFixtures = fs::path(CRUCIBLE_SOURCE_DIR) / "tests/models/fixtures/mace";

class MaceImportE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("crucible_mace_import_e2e_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    for (const std::string name : {"cu_32x0e32x1o_float32_compiled.model", "tial_16x0e16x1o16x2e.pt"}) {
      const std::string cmd = "gzip -dc '" + (kFixtures / (name + ".gz")).string() + "' > '" + (dir_ / name).string() + "'";
      ASSERT_EQ(std::system(cmd.c_str()), 0);
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static fs::path dir_;
};

fs::path MaceImportE2e::dir_;

/// Relative difference with an absolute floor (tests/models/test_mace_import.cpp
/// says why: the near-cutoff pair's forces are rounding-level).
double rel(const at::Tensor& got, const at::Tensor& want, double tol) {
  const double floor = tol < 1e-8 ? 1e-14 : 1e-6;
  return (got - want).abs().max().item<double>() / (want.abs().max().item<double>() + floor / tol);
}

/// Evaluates `run` on the fixture structures of `model` and compares the
/// written predictions with MACE's (keys with `suffix`) to `tol`.
void expect_evaluate_equals_mace(const fs::path& dir, const std::string& run, const std::string& model,
                                 const std::string& suffix, double tol) {
  const std::string ref = (kFixtures / (model + "_reference.extxyz")).string();
  const std::string out = (dir / (run + "_pred.xyz")).string();
  const Result r = run_crucible(dir, {"evaluate", "--model", run, "--data", ref, "--write", out,
                                      "data.energy_key=mace_energy" + suffix, "data.forces_key=mace_forces" + suffix,
                                      "data.stress_key=mace_stress" + suffix});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  ExtxyzOptions mine;
  mine.energy_key = "crucible_energy";
  mine.forces_key = "crucible_forces";
  mine.stress_key = "crucible_stress";
  ExtxyzOptions theirs;
  theirs.energy_key = "mace_energy" + suffix;
  theirs.forces_key = "mace_forces" + suffix;
  theirs.stress_key = "mace_stress" + suffix;
  const auto got = read_extxyz(out, mine);
  const auto want = read_extxyz(ref, theirs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    SCOPED_TRACE(model + " structure " + std::to_string(k));
    EXPECT_LE(std::abs(*got[k].energy - *want[k].energy) / std::abs(*want[k].energy), tol);
    EXPECT_LE(rel(*got[k].forces, *want[k].forces, tol), tol);
    if (want[k].stress && want[k].info.count("mace_stress_volume") == 0) {
      ASSERT_TRUE(got[k].stress.has_value());
      EXPECT_LE(rel(*got[k].stress, *want[k].stress, tol), tol);
    }
  }
}

TEST_F(MaceImportE2e, TorchScriptImportEvaluatesAsMaceAndInfoShowsTheOrigin) {
  const std::string file = (dir_ / "cu_32x0e32x1o_float32_compiled.model").string();
  const Result r = run_crucible(dir_, {"import", "mace", file, "--out", "cu32"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("torchscript"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(read_text(dir_ / "cu32/model.json"));
  EXPECT_EQ(j.at("model_type"), "mace");
  EXPECT_EQ(j.at("dtype"), "float32");
  EXPECT_EQ(j.at("origin").at("mace_version"), "0.3.14");
  EXPECT_EQ(j.at("origin").at("sha256").get<std::string>().size(), 64u);
  const Result info = run_crucible(dir_, {"info", "cu32"});
  ASSERT_EQ(info.rc, 0) << info.err;
  EXPECT_NE(info.out.find("imported from MACE 0.3.14"), std::string::npos) << info.out;
  // evaluate runs a float32 model in float32: MACE's float32 evaluation.
  expect_evaluate_equals_mace(dir_, "cu32", "cu_32x0e32x1o_float32", "_float32", 1e-5);
}

TEST_F(MaceImportE2e, StateDictImportEvaluatesAsMaceToE10) {
  const std::string file = (dir_ / "tial_16x0e16x1o16x2e.pt").string();
  const Result r = run_crucible(dir_, {"import", "mace", file, "--hyperparameters",
                                       (kFixtures / "tial_16x0e16x1o16x2e.json").string(), "--out", "tial"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  expect_evaluate_equals_mace(dir_, "tial", "tial_16x0e16x1o16x2e", "", 1e-10);
}

TEST_F(MaceImportE2e, BadInputIsRefusedAndNothingIsOverwritten) {
  const std::string pt = (dir_ / "tial_16x0e16x1o16x2e.pt").string();
  // A .pt without its hyper-parameters: not TorchScript, says what to add.
  Result r = run_crucible(dir_, {"import", "mace", pt, "--out", "nohp"});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--hyperparameters"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "nohp"));
  // An existing, non-empty output directory is left as it is.
  fs::create_directories(dir_ / "taken");
  write_text(dir_ / "taken/keep.txt", "mine");
  r = run_crucible(dir_, {"import", "mace", pt, "--hyperparameters", (kFixtures / "tial_16x0e16x1o16x2e.json").string(),
                          "--out", "taken"});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("not an empty directory"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(dir_ / "taken/keep.txt"), "mine");
  EXPECT_FALSE(fs::exists(dir_ / "taken/model.pt"));
}

}  // namespace
}  // namespace crucible
