// Issue 16 acceptance through the real binary with model.type=mace: train,
// SIGTERM and resume bit for bit (EMA on), evaluate equal to the final
// validation, and every precision mode.

#include "crucible/cli/model_io.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <regex>

namespace crucible {
namespace {

using namespace e2e;

class MaceE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("crucible_mace_e2e_" + std::to_string(::getpid()));
    ASSERT_TRUE(make_tiny_tial_dir(dir_));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  /// A small MACE (every part present: l = 2 harmonics, correlation 3, two
  /// interactions) on 10 TiAl frames.
  static std::vector<std::string> args(const std::string& run) {
    return {"train",
            "data.train_file=" + (dir_ / "tiny.xyz").string(),
            "data.valid_file=" + (dir_ / "tiny_valid.xyz").string(),
            "training.num_epochs=3",
            "training.batch_size=4",
            "model.type=mace",
            "model.cutoff=4.5",
            "model.mace.hidden_irreps=4x0e+4x1o",
            "model.mace.max_ell=2",
            "model.mace.num_bessel=4",
            "model.mace.radial_mlp=[8, 8]",
            "model.mace.mlp_irreps=4x0e",
            "output.run_dir=" + run};
  }
  static fs::path dir_;
};

fs::path MaceE2e::dir_;

TEST_F(MaceE2e, TrainSigtermResumeAndEvaluateWithEma) {
  const fs::path full = dir_ / "full";
  auto a = args(full.string());
  a.push_back("training.ema.enabled=true");
  Result r = run_crucible(dir_, a);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("model      mace: hidden_irreps 4x0e+4x1o, max_ell 2, correlation 3"), std::string::npos)
      << r.out;
  const auto meta = nlohmann::json::parse(read_text(full / "model.json"));
  EXPECT_EQ(meta.at("model_type"), "mace");
  EXPECT_EQ(meta.at("hyperparameters").at("atomic_numbers"), nlohmann::json({13, 22}));
  EXPECT_GT(meta.at("hyperparameters").at("avg_num_neighbors").get<double>(), 5.0);
  const auto summary = nlohmann::json::parse(read_text(full / "summary.json"));
  EXPECT_EQ(summary.at("model_weights"), "ema");

  const fs::path cut = dir_ / "cut";
  a = args(cut.string());
  a.push_back("training.ema.enabled=true");
  ::setenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH", "4", 1);
  r = run_crucible(dir_, a);
  ::unsetenv("CRUCIBLE_FAULT_SIGTERM_AT_BATCH");
  ASSERT_EQ(r.rc, 143) << r.out << r.err;
  r = run_crucible(dir_, {"train", "--resume", cut.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const auto va = summary.at("validation");
  const auto vb = nlohmann::json::parse(read_text(cut / "summary.json")).at("validation");
  for (const char* k : {"energy_mae", "forces_mae", "stress_mae"}) EXPECT_EQ(va.at(k), vb.at(k)) << k;
  // The saved weights are bit-identical too.
  const LoadedModel ma = load_model(full.string()), mb = load_model(cut.string());
  auto pa = ma.model->module().named_parameters();
  auto pb = mb.model->module().named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa) EXPECT_TRUE(at::equal(p.value(), pb[p.key()])) << p.key();

  // evaluate on the validation file reproduces the final validation metrics.
  const fs::path out_json = dir_ / "eval.json";
  r = run_crucible(dir_, {"evaluate", "--model", full.string(), "--data", (dir_ / "tiny_valid.xyz").string(),
                          "--json", out_json.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const auto ev = nlohmann::json::parse(read_text(out_json));
  EXPECT_NEAR(ev.at("forces_mae").get<double>(), va.at("forces_mae").get<double>(),
              1e-6 * va.at("forces_mae").get<double>());

  // Issue 17: parity plots, one point per energy and force component.
  const fs::path svg = dir_ / "parity.svg";
  r = run_crucible(dir_, {"evaluate", "--model", full.string(), "--data", (dir_ / "tiny_valid.xyz").string(),
                          "--parity", svg.string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string picture = read_text(svg);
  size_t points = 0;
  for (size_t p = picture.find("class=\"point\""); p != std::string::npos; p = picture.find("class=\"point\"", p + 1)) ++points;
  EXPECT_EQ(points, ev.at("num_energies").get<size_t>() + ev.at("num_forces").get<size_t>());
  EXPECT_EQ(picture.find("no data"), std::string::npos);
  EXPECT_NE(picture.find("class=\"diagonal\""), std::string::npos);

  // Issue 17: crucible info; evaluate refuses an element the model lacks and
  // atoms closer than model.json's min_distance_angstrom.
  r = run_crucible(dir_, {"info", (full / "model.pt").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("type            mace"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("elements        Al Ti"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recipe ("), std::string::npos) << r.out;
  const double dmin = meta.at("min_distance_angstrom").get<double>();
  EXPECT_GT(dmin, 0.5);
  EXPECT_LT(dmin, 2.0);
  std::string frame = frames_of((dir_ / "tiny_valid.xyz").string())[0];
  write_text(dir_ / "fe.xyz", std::regex_replace(frame, std::regex("\nTi "), "\nFe ", std::regex_constants::format_first_only));
  r = run_crucible(dir_, {"evaluate", "--model", full.string(), "--data", (dir_ / "fe.xyz").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("must contain only elements the model was trained on (Al Ti), got Fe"), std::string::npos)
      << r.err;
  const std::string close = "2\nLattice=\"10 0 0 0 10 0 0 0 10\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n"
                            "Ti 0 0 0\nAl " + std::to_string(0.9 * dmin) + " 0 0\n";
  write_text(dir_ / "close.xyz", close);
  r = run_crucible(dir_, {"evaluate", "--model", full.string(), "--data", (dir_ / "close.xyz").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("atoms must be at least"), std::string::npos) << r.err;
}

TEST_F(MaceE2e, EveryPrecisionModeTrains) {
  // The modes `crucible train` offers (bf16-true and 16-true are C++ API only:
  // tests/precision/test_force_path_dtypes.cpp).
  for (const char* precision : {"64-true", "32-true", "bf16-mixed", "16-mixed"}) {
    SCOPED_TRACE(precision);
    const fs::path run = dir_ / (std::string("prec_") + precision);
    auto a = args(run.string());
    a.push_back("training.num_epochs=null");
    a.push_back("training.num_steps=2");
    a.push_back(std::string("training.precision=") + precision);
    const Result r = run_crucible(dir_, a);
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    const auto s = nlohmann::json::parse(read_text(run / "summary.json"));
    EXPECT_EQ(s.at("precision"), precision);
    const double f = s.at("validation").at("forces_mae").get<double>();
    EXPECT_TRUE(std::isfinite(f) && f > 0) << f;
    const auto meta = nlohmann::json::parse(read_text(run / "model.json"));
    EXPECT_EQ(meta.at("dtype"), std::string(precision) == "64-true" ? "float64" : "float32");
  }
}

}  // namespace
}  // namespace crucible
