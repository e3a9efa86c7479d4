// training.precision (issue 3): the config key, its choices, and a short
// `crucible train` run under 16-mixed / bf16-mixed (summary: final scale).

#include "crucible/run/training_run.h"
#include "crucible/common/error.h"
#include "crucible/config/config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace crucible {
namespace {

TEST(PrecisionConfig, KeyDefaultsToNullAndAcceptsTheModes) {
  Config c = default_config();
  EXPECT_FALSE(c.training.precision.has_value());
  apply_overrides(c, {"training.precision=bf16-mixed"});
  EXPECT_EQ(c.training.precision.value(), "bf16-mixed");
  EXPECT_NO_THROW(validate_config(c));
  try {
    apply_overrides(c, {"training.precision=fp8"});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("training.precision must be one of"), std::string::npos)
        << e.what();
  }
  c.training.precision = "bf16-true";  // set programmatically: validate_config checks it too
  EXPECT_THROW(validate_config(c), ConfigError);
}

Config tiny_run(const std::string& precision, const std::string& name) {
  Config c = default_config();
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  apply_overrides(c, {"training.precision=" + precision, "training.num_epochs=null",
                      "training.num_steps=3", "model.schnet.hidden_channels=8", "model.schnet.num_filters=8",
                      "model.schnet.num_interactions=1", "model.schnet.num_gaussians=6",
                      "output.run_dir=" + dir.string()});
  return c;
}

TEST(PrecisionConfig, SixteenMixedRunReportsTheFinalScale) {
  Config c = tiny_run("16-mixed", "crucible_prec16");
  std::ostringstream out, err;
  TrainResult r = run_training(c, out, err);
  EXPECT_GE(r.steps, 0);  // inf/NaN steps (if any) are skipped, not counted
  EXPECT_NE(out.str().find("precision 16-mixed"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("gradient scaler: final scale"), std::string::npos) << out.str();
  std::ifstream f(fs::path(r.run_dir) / "summary.json");
  const auto summary = nlohmann::json::parse(f);
  EXPECT_EQ(summary.at("precision"), "16-mixed");
  EXPECT_GT(summary.at("grad_scale").get<double>(), 0.0);
  fs::remove_all(r.run_dir);
}

TEST(PrecisionConfig, Bf16MixedRunTrainsInFloat32) {
  Config c = tiny_run("bf16-mixed", "crucible_precbf16");
  std::ostringstream out, err;
  TrainResult r = run_training(c, out, err);
  EXPECT_EQ(r.steps, 3);
  EXPECT_TRUE(std::isfinite(r.validation.forces_mae));
  std::ifstream f(fs::path(r.run_dir) / "model.json");
  const auto meta = nlohmann::json::parse(f);
  EXPECT_EQ(meta.at("dtype"), "float32");
  fs::remove_all(r.run_dir);
}

}  // namespace
}  // namespace crucible
