// Issue 16 acceptance through the real binary with model.type=mace: train,
// SIGTERM and resume bit for bit (EMA on), evaluate equal to the final
// validation, and every precision mode.

#include "crucible/run/model_io.h"

#include "cli/e2e_helpers.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <sstream>
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
  EXPECT_EQ(points, ev.at("num_energies").get<size_t>() + ev.at("num_forces").get<size_t>() +
                        ev.at("num_stresses").get<size_t>());  // issue 47: a stress panel
  EXPECT_NE(picture.find("class=\"title\""), std::string::npos);
  EXPECT_NE(picture.find("RMSE "), std::string::npos);
  EXPECT_EQ(picture.find("no data"), std::string::npos);
  EXPECT_NE(picture.find("class=\"diagonal\""), std::string::npos);

  // Issue 17: crucible info; evaluate refuses an element the model lacks and
  // atoms closer than model.json's min_distance_angstrom.
  r = run_crucible(dir_, {"info", (full / "model.pt").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("type            mace"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("elements        Al Ti"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recipe ("), std::string::npos) << r.out;
  // Issue 47: how good the model is, the closest distance it accepts and its reach.
  EXPECT_NE(r.out.find(fmt::format("interaction range {:.4g} Å",
                                   meta.at("hyperparameters").at("num_interactions").get<int64_t>() *
                                       meta.at("hyperparameters").at("cutoff").get<double>())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(fmt::format("min distance    {:.4g} Å", meta.at("min_distance_angstrom").get<double>())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("validation      of model.pt on the run's"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  forces  MAE "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zero-forces baseline MAE"), std::string::npos) << r.out;
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

// Issue 46 deliverable 6: model.type=mace keeps the best stage-two
// validation as model.pt and the last weights as model_last.pt. Oracles:
// the validation losses metrics.jsonl logged, and `crucible evaluate` of
// each file against summary.json.
TEST_F(MaceE2e, ModelPtIsTheBestStageTwoValidationAndModelLastPtTheLast) {
  const fs::path run = dir_ / "best";
  auto a = args(run.string());
  a.push_back("training.num_epochs=6");  // stage two from max(1, 6 // 4 * 3) = 3
  a.push_back("training.optimizer.lr=0.05");
  Result r = run_crucible(dir_, a);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("stage two from epoch 3 (counted from 0): lr 0.001, weights energy 1000"),
            std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(run / "model_last.pt"));
  const auto summary = nlohmann::json::parse(read_text(run / "summary.json"));
  const auto& chosen = summary.at("model_pt");
  EXPECT_EQ(chosen.at("weights"), "best");
  EXPECT_EQ(chosen.at("monitor"), "loss");
  // The oracle: the lowest logged validation loss among stage-two
  // validations (epoch >= 3; earlier losses used other weights).
  double lowest = std::numeric_limits<double>::infinity();
  int64_t lowest_epoch = -1;
  std::istringstream lines(read_text(run / "metrics.jsonl"));
  int stage_two_validations = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") != "validation" || j.at("final").get<bool>()) continue;
    if (j.at("epoch").get<int64_t>() < 3) continue;
    ++stage_two_validations;
    if (j.at("loss").get<double>() < lowest) {
      lowest = j.at("loss").get<double>();
      lowest_epoch = j.at("epoch").get<int64_t>();
    }
  }
  EXPECT_EQ(stage_two_validations, 4);  // after epochs 3, 4, 5, 6 (epoch_count)
  EXPECT_EQ(chosen.at("epoch").get<int64_t>(), lowest_epoch);
  EXPECT_DOUBLE_EQ(chosen.at("value").get<double>(), lowest);
  // evaluate reproduces summary.json for each file.
  for (const auto& [file, key] : std::vector<std::pair<std::string, std::string>>{
           {run.string(), "validation"}, {(run / "model_last.pt").string(), "last_validation"}}) {
    if (!summary.contains(key)) continue;  // the best was the last validation
    const fs::path out_json = dir_ / "best_eval.json";
    r = run_crucible(dir_, {"evaluate", "--model", file, "--data", (dir_ / "tiny_valid.xyz").string(),
                            "--json", out_json.string()});
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    const auto ev = nlohmann::json::parse(read_text(out_json));
    const double expected = summary.at(key).at("forces_mae").get<double>();
    EXPECT_NEAR(ev.at("forces_mae").get<double>(), expected, 1e-6 * expected) << file;
  }
  // output.model_pt=last keeps the last weights, with no model_last.pt.
  const fs::path last = dir_ / "last";
  a = args(last.string());
  a.push_back("output.model_pt=last");
  r = run_crucible(dir_, a);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(last / "model_last.pt"));
  EXPECT_EQ(nlohmann::json::parse(read_text(last / "summary.json")).at("model_pt").at("weights"), "last");
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
