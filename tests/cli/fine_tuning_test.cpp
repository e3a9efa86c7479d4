// Fine-tuning (issue 18): model.init_from and training.freeze through the
// binary. A model trained on the first 200 bundled TiAl frames, fine-tuned
// on frames 200-299, must validate on frames 300-328 better than the same
// steps from scratch (both figures printed); frozen parameters must stay
// bit-identical; mismatches are errors naming the parameters.

#include "crucible/run/fine_tuning.h"
#include "crucible/run/model_io.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <regex>

namespace crucible {
namespace {

namespace fs = std::filesystem;

class FineTuning : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("crucible_finetune_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const auto frames = e2e::frames_of(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
    ASSERT_GE(frames.size(), 320u);
    auto write = [&](const std::string& name, size_t lo, size_t hi) {
      std::string text;
      for (size_t k = lo; k < hi && k < frames.size(); ++k) text += frames[k];
      e2e::write_text(dir_ / name, text);
    };
    write("part_a.xyz", 0, 200);
    write("part_b.xyz", 200, 300);
    write("part_b_valid.xyz", 300, frames.size());
    const auto r = e2e::run_crucible(dir_, {"train", "data.train_file=part_a.xyz", "training.num_epochs=15",
                                            "training.dtype=float64", "output.run_dir=source"});
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static e2e::Result tune(const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> args{"train", "data.train_file=part_b.xyz", "data.valid_file=part_b_valid.xyz",
                                  "training.num_epochs=3", "training.dtype=float64", "output.run_dir=" + run};
    args.insert(args.end(), extra.begin(), extra.end());
    return e2e::run_crucible(dir_, args);
  }
  static nlohmann::json validation(const std::string& run) {
    return nlohmann::json::parse(e2e::read_text(dir_ / run / "summary.json"))["validation"];
  }

  static fs::path dir_;
};
fs::path FineTuning::dir_;

TEST_F(FineTuning, FromAModelOfPartOfTheDataBeatsScratchAfterTheSameSteps) {
  const auto scratch = tune("scratch", {});
  ASSERT_EQ(scratch.rc, 0) << scratch.err;
  const auto tuned = tune("tuned", {"model.init_from=source"});
  ASSERT_EQ(tuned.rc, 0) << tuned.err;
  const auto s = validation("scratch"), t = validation("tuned");
  std::cout << "fine-tuning (3 epochs on frames 200-299, validated on 300-328): force MAE "
            << t["forces_mae"].get<double>() << " meV/Å tuned vs " << s["forces_mae"].get<double>()
            << " from scratch; energy MAE " << t["energy_mae"].get<double>() << " vs " << s["energy_mae"].get<double>()
            << " meV/atom\n";
  EXPECT_LT(t["forces_mae"].get<double>(), s["forces_mae"].get<double>());
  EXPECT_LT(t["energy_mae"].get<double>(), s["energy_mae"].get<double>());
  EXPECT_EQ(nlohmann::json::parse(e2e::read_text(dir_ / "tuned" / "summary.json"))["steps"],
            nlohmann::json::parse(e2e::read_text(dir_ / "scratch" / "summary.json"))["steps"]);
}

TEST_F(FineTuning, FrozenParametersStayBitIdentical) {
  const auto r = tune("frozen", {"model.init_from=source", "training.freeze=^embedding"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const LoadedModel source = load_model((dir_ / "source").string());
  const LoadedModel frozen = load_model((dir_ / "frozen").string());
  const auto a = source.model->module().named_parameters();
  int same = 0, moved = 0;
  for (const auto& item : frozen.model->module().named_parameters()) {
    const at::Tensor& before = *a.find(item.key());
    if (std::regex_search(item.key(), std::regex("^embedding"))) {
      EXPECT_TRUE(at::equal(before, item.value())) << item.key() << " changed although frozen";
      ++same;
    } else {
      moved += !at::equal(before, item.value());
    }
  }
  EXPECT_GE(same, 1);
  EXPECT_GE(moved, 3);  // the others trained
}

TEST_F(FineTuning, ReplayDrawsFromTheOriginalDataEveryEpochAndForgetsLess) {
  const auto plain = tune("forgetful", {"model.init_from=source", "training.num_epochs=4"});
  ASSERT_EQ(plain.rc, 0) << plain.err;
  const auto replay = tune("replayed", {"model.init_from=source", "training.num_epochs=4", "training.replay.file=part_a.xyz",
                                        "training.replay.fraction=0.5"});
  ASSERT_EQ(replay.rc, 0) << replay.err;
  EXPECT_NE(replay.out.find("replays 50 of the 200 structures of"), std::string::npos) << replay.out;
  // 100 new + 50 replayed structures per epoch, batches of 4: 38 a epoch.
  EXPECT_EQ(nlohmann::json::parse(e2e::read_text(dir_ / "replayed" / "summary.json"))["steps"], 4 * 38);
  EXPECT_EQ(nlohmann::json::parse(e2e::read_text(dir_ / "forgetful" / "summary.json"))["steps"], 4 * 25);
  auto error_on_a = [&](const std::string& run) {
    const auto r = e2e::run_crucible(dir_, {"evaluate", "--model", run, "--data", "part_a.xyz", "--json", run + "_a.json"});
    EXPECT_EQ(r.rc, 0) << r.err;
    return nlohmann::json::parse(e2e::read_text(dir_ / (run + "_a.json")));
  };
  const auto with = error_on_a("replayed"), without = error_on_a("forgetful");
  std::cout << "replay: force MAE on the original data " << with["forces_mae"].get<double>() << " meV/Å with replay vs "
            << without["forces_mae"].get<double>() << " without\n";
  EXPECT_LT(with["forces_mae"].get<double>(), without["forces_mae"].get<double>());
}

TEST_F(FineTuning, MismatchesAreErrorsNamingTheParameters) {
  const auto shape = tune("wide", {"model.init_from=source", "model.schnet.hidden_channels=48"});
  EXPECT_EQ(shape.rc, 1);
  EXPECT_NE(shape.err.find("parameters differ from the model this config builds (embedding.weight [119, 32] in the "
                           "source, [119, 48] here"),
            std::string::npos)
      << shape.err;
  EXPECT_FALSE(fs::exists(dir_ / "wide"));
  const auto type = tune("mace", {"model.init_from=source", "model.type=mace"});
  EXPECT_EQ(type.rc, 1);
  EXPECT_NE(type.err.find("is a schnet model; model.type must be the same, got mace"), std::string::npos) << type.err;
  const auto none = tune("none", {"model.init_from=source", "training.freeze=no_such_parameter"});
  EXPECT_EQ(none.rc, 1);
  EXPECT_NE(none.err.find("training.freeze 'no_such_parameter' matches no parameter; names look like"), std::string::npos)
      << none.err;
  const auto missing = tune("missing", {"model.init_from=nowhere"});
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("model.init_from: "), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace crucible
