// Issue 46 deliverables 5 and 6 in the config layer: model.type = mace
// brings MACE's recipe (mace v0.3.14 mace/tools/arg_parser.py defaults,
// written out here as the oracle), under the user's file and overrides;
// configs/mace.yaml spells the same recipe out; MACE's argument names are
// refused with the Crucible key; stage two's settings are checked.

#include "crucible/common/error.h"
#include "crucible/config/config.h"
#include "crucible/losses/loss_weight_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace crucible {
namespace {

std::string recipe_error_of(const std::vector<std::string>& overrides) {
  try {
    validate_config(load_run_config("", overrides));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(MaceRecipe, ModelTypeMaceAloneGivesMacesRecipe) {
  const Config c = load_run_config("", {"model.type=mace"});
  EXPECT_NO_THROW(validate_config(c));
  const auto& t = c.training;
  // mace/tools/arg_parser.py defaults.
  EXPECT_EQ(t.batch_size, 10);
  EXPECT_EQ(t.optimizer.name, "adam");
  EXPECT_TRUE(t.optimizer.amsgrad);
  EXPECT_DOUBLE_EQ(t.optimizer.lr, 0.01);
  EXPECT_EQ(t.scheduler.name, "plateau");  // ReduceLROnPlateau on the validation loss
  EXPECT_EQ(t.scheduler.monitor, "loss");
  EXPECT_DOUBLE_EQ(t.scheduler.factor, 0.8);
  EXPECT_EQ(t.scheduler.patience, 50);
  EXPECT_DOUBLE_EQ(t.clip_grad_norm, 10.0);
  EXPECT_DOUBLE_EQ(t.loss.energy_weight, 1.0);
  EXPECT_DOUBLE_EQ(t.loss.forces_weight, 100.0);
  EXPECT_DOUBLE_EQ(t.loss.stress_weight, 1.0);
  EXPECT_TRUE(t.ema.enabled);
  EXPECT_DOUBLE_EQ(t.ema.decay, 0.99);
  EXPECT_TRUE(t.ema.warmup);
  EXPECT_TRUE(t.ema.use_for_validation);
  EXPECT_TRUE(t.stage_two.enabled);
  EXPECT_DOUBLE_EQ(t.stage_two.lr, 1e-3);
  EXPECT_DOUBLE_EQ(t.stage_two.energy_weight, 1000.0);
  EXPECT_DOUBLE_EQ(t.stage_two.forces_weight, 100.0);
  EXPECT_DOUBLE_EQ(t.stage_two.stress_weight, 10.0);
  EXPECT_EQ(t.early_stopping.monitor, "loss");
  EXPECT_EQ(t.early_stopping.patience, 2048);
  EXPECT_EQ(c.model.scaling, "rms_forces_scaling");
  EXPECT_EQ(c.model.shift, "zero");  // model "MACE": atomic_inter_shift 0
  EXPECT_EQ(c.output.model_pt, "best");

  // SchNet keeps Crucible's defaults.
  EXPECT_EQ(load_run_config("", {}), default_config());
  EXPECT_FALSE(load_run_config("", {"model.type=schnet"}).training.ema.enabled);
}

TEST(MaceRecipe, TheUsersLayersWinAndTheRecipeSetsWhatKeepsItsDefault) {
  const Config c = load_run_config("", {"model.type=mace", "training.ema.enabled=false",
                                        "training.scheduler.name=constant",
                                        "training.optimizer.name=sgd",
                                        "training.optimizer.amsgrad=false"});
  EXPECT_FALSE(c.training.ema.enabled);
  EXPECT_EQ(c.training.scheduler.name, "constant");
  // The plateau options the recipe set are the MACE run's defaults: switching
  // the schedule off does not ask the user to reset them.
  EXPECT_NO_THROW(validate_config(c));
  // Outside the recipe, a plateau option with another schedule is still refused.
  EXPECT_NE(recipe_error_of({"model.type=mace", "training.scheduler.name=constant",
                      "training.scheduler.factor=0.5"})
                .find("training.scheduler.factor is used only by the plateau schedule"),
            std::string::npos);
}

TEST(MaceRecipe, BundledMaceYamlSpellsOutTheRecipe) {
  Config file = load_run_config(std::string(CRUCIBLE_SOURCE_DIR) + "/configs/mace.yaml", {});
  EXPECT_NO_THROW(validate_config(file));
  Config recipe = load_run_config("", {"model.type=mace"});
  // The file adds the data, the run length and the output; everything else
  // is the recipe's.
  recipe.data = file.data;
  recipe.training.num_epochs = file.training.num_epochs;
  recipe.training.num_steps = file.training.num_steps;
  recipe.output = file.output;
  EXPECT_EQ(dump_config(file, false), dump_config(recipe, false));
}

TEST(MaceRecipe, StageTwoStartsAtMacesDefaultEpochAndFoldsIntoTheLoss) {
  // max(1, max_num_epochs // 4 * 3), mace/tools/arg_parser_tools.py.
  for (const auto& [epochs, start] : std::vector<std::pair<int64_t, int64_t>>{
           {60, 45}, {20, 15}, {3, 1}, {10, 6}, {7, 3}}) {
    Config c = load_run_config("", {"model.type=mace", "training.num_epochs=" + std::to_string(epochs)});
    EXPECT_EQ(stage_two_start_epoch(c.training), start) << epochs;
    const LossSettings l = effective_loss_settings(c.training);
    EXPECT_EQ(l.schedule, "step");
    EXPECT_EQ(l.schedule_clock, "epoch");
    EXPECT_EQ(l.schedule_start, start);
    auto energy = loss_weight_schedule(l, "energy");
    EXPECT_DOUBLE_EQ(energy->weight(0, start - 1), 1.0);
    EXPECT_DOUBLE_EQ(energy->weight(0, start), 1000.0);
    EXPECT_DOUBLE_EQ(loss_weight_schedule(l, "stress")->weight(0, start), 10.0);
  }
  Config c = load_run_config("", {"model.type=mace", "training.stage_two.start_epoch=4"});
  EXPECT_EQ(stage_two_start_epoch(c.training), 4);
  EXPECT_FALSE(stage_two_start_epoch(default_config().training).has_value());
  EXPECT_EQ(effective_loss_settings(default_config().training).schedule, "constant");
}

TEST(MaceRecipe, StageTwoSettingsAreChecked) {
  EXPECT_EQ(recipe_error_of({"model.type=mace", "training.num_epochs=10", "training.stage_two.start_epoch=10"}),
            "training.stage_two.start_epoch must be < training.num_epochs (10), got 10; stage two "
            "would never start");
  EXPECT_EQ(recipe_error_of({"model.type=mace", "training.loss.schedule=linear"}),
            "training.stage_two sets the loss weights from its start epoch, so "
            "training.loss.schedule must be constant, got 'linear'; use one of the two");
  EXPECT_EQ(recipe_error_of({"training.stage_two.lr=0.01"}),
            "training.stage_two.lr is used only by stage two; set training.stage_two.enabled=true, "
            "or keep its default");
  // With num_steps the default start needs the run's epochs (from the data).
  const Config steps = load_run_config("", {"model.type=mace", "training.num_steps=100"});
  EXPECT_NO_THROW(validate_config(steps));
  EXPECT_THROW((void)stage_two_start_epoch(steps.training), ConfigError);
  EXPECT_EQ(stage_two_start_epoch(steps.training, 9), 6);
  EXPECT_EQ(recipe_error_of({"model.type=mace", "training.num_steps=100", "training.stage_two.start_epoch=2"}), "");
  EXPECT_EQ(recipe_error_of({"model.init_from=somewhere", "model.shift=zero"}),
            "model.shift must keep its default with model.init_from: the source model's energy "
            "scale and shift are kept");
  // With model.type mace, zero is the default, so init_from accepts it.
  EXPECT_EQ(recipe_error_of({"model.type=mace", "model.init_from=somewhere"}), "");
}

TEST(MaceRecipe, MacesArgumentNamesAreRefusedWithTheCrucibleKey) {
  auto message = [](const std::string& text) {
    try {
      (void)load_run_config("", {text});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message("r_max=5.0"),
            "config key 'r_max' in command-line override 'r_max=5.0' is MACE's --r_max; in "
            "Crucible set model.cutoff (Å)");
  const std::string max_l = message("model.mace.max_L=1");
  EXPECT_NE(max_l.find("is MACE's --max_L; in Crucible set model.mace.hidden_irreps"), std::string::npos) << max_l;
  EXPECT_NE(max_l.find("'128x0e+128x1o'"), std::string::npos) << max_l;
  EXPECT_EQ(max_l.find("did you mean"), std::string::npos) << max_l;  // not max_ell, another quantity
  EXPECT_NE(message("num_channels=128").find("set model.mace.hidden_irreps"), std::string::npos);
  EXPECT_NE(message("E0s=average").find("is MACE's --E0s; in Crucible set data.e0s (MACE's average is least_squares"),
            std::string::npos);
  EXPECT_NE(message("training.swa_lr=0.001").find("set training.stage_two.lr"), std::string::npos);
  EXPECT_NE(message("max_num_epochs=10").find("set training.num_epochs"), std::string::npos);
  EXPECT_NE(message("scaling=std_scaling").find("set model.scaling"), std::string::npos);
  // A plain word inside a section is a typo, not MACE's flat key.
  const std::string typo = message("training.ema.seed=1");
  EXPECT_EQ(typo.find("MACE"), std::string::npos) << typo;
  EXPECT_NE(typo.find("unknown config key 'training.ema.seed'"), std::string::npos) << typo;
  // A MACE YAML file: the line is named.
  const std::string text = "model: MACE\nr_max: 5.0\n";
  Config c = default_config();
  try {
    apply_config_yaml(c, text, "mace_args.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("config key 'model' in mace_args.yaml (line 1)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace crucible
