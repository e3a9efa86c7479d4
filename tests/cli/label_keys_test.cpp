// Label keys that match nothing (issue 18): the message lists the file's
// keys and the MACE name that would match; train and evaluate stop.

#include "crucible/cli/label_keys.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

namespace crucible {
namespace {

namespace fs = std::filesystem;

TEST(LabelKeys, MessageListsTheFileKeysAndTheMaceNameThatMatches) {
  Structure a, b;
  a.info = {{"dft_energy", "-3.2"}, {"spacegroup", "P 1"}};
  a.columns = {"species", "pos", "dft_force"};
  b.info = {{"note", "x"}};
  b.columns = {"species", "pos"};
  DataConfig d;
  const std::string e = missing_label_message({a, b}, "set.xyz", LabelKind::kEnergy, d);
  EXPECT_EQ(e,
            "set.xyz: no frame has the energy key 'energy' (data.energy_key); its header keys are dft_energy, note, "
            "spacegroup; set data.energy_key=dft_energy (one of MACE's names for the energy)");
  const std::string f = missing_label_message({a, b}, "set.xyz", LabelKind::kForces, d);
  EXPECT_EQ(f,
            "set.xyz: no frame has the forces column 'forces' (or 'force') (data.forces_key); its Properties columns "
            "are dft_force, pos, species; set data.forces_key=dft_force (one of MACE's names for the forces)");
  a.info = {{"REF_energy_PBE", "-1"}};
  EXPECT_NE(missing_label_message({a}, "s.xyz", LabelKind::kEnergy, d).find("set data.energy_key=REF_energy_PBE"),
            std::string::npos);
  a.info = {{"spacegroup", "P 1"}};
  EXPECT_NE(missing_label_message({a}, "s.xyz", LabelKind::kEnergy, d).find("MACE's names would be REF_energy"),
            std::string::npos);
}

TEST(LabelKeysEndToEnd, TrainAndEvaluateStopOnKeysThatMatchNothing) {
  const fs::path dir = fs::temp_directory_path() / ("crucible_keys_" + std::to_string(::getpid()));
  ASSERT_TRUE(e2e::make_tiny_tial_dir(dir));
  // MOF-style names: dft_energy and a dft_force column.
  std::string text = e2e::read_text(dir / "tiny.xyz");
  text = std::regex_replace(text, std::regex(" energy="), " dft_energy=");
  text = std::regex_replace(text, std::regex(":force:R:3"), ":dft_force:R:3");
  e2e::write_text(dir / "dft.xyz", text);
  const auto forces = e2e::run_crucible(dir, {"train", "data.train_file=dft.xyz", "data.energy_key=dft_energy",
                                              "training.num_epochs=1", "output.run_dir=run"});
  EXPECT_EQ(forces.rc, 1);
  EXPECT_NE(forces.err.find("no frame has the forces column 'forces' (or 'force')"), std::string::npos) << forces.err;
  EXPECT_NE(forces.err.find("set data.forces_key=dft_force"), std::string::npos) << forces.err;
  EXPECT_FALSE(fs::exists(dir / "run"));
  const auto energy = e2e::run_crucible(dir, {"train", "data.train_file=dft.xyz", "data.forces_key=dft_force",
                                              "training.num_epochs=1", "output.run_dir=run"});
  EXPECT_EQ(energy.rc, 1);
  EXPECT_NE(energy.err.find("set data.energy_key=dft_energy"), std::string::npos) << energy.err;
  const auto ok = e2e::run_crucible(dir, {"train", "data.train_file=dft.xyz", "data.forces_key=dft_force",
                                          "data.energy_key=dft_energy", "data.valid_file=tiny_valid.xyz",
                                          "training.num_epochs=1", "output.run_dir=run"});
  ASSERT_EQ(ok.rc, 0) << ok.err;
  // evaluate with the model's keys (energy, forces) on the dft_* file: an error.
  const auto eval = e2e::run_crucible(dir, {"evaluate", "--model", "run", "--data", "tiny.xyz"});
  EXPECT_EQ(eval.rc, 1) << eval.out;
  EXPECT_NE(eval.err.find("tiny.xyz: no frame has the energy key 'dft_energy'"), std::string::npos) << eval.err;
  EXPECT_NE(eval.err.find("set data.energy_key=energy"), std::string::npos) << eval.err;
  // Only predictions: fine.
  const auto write = e2e::run_crucible(dir, {"evaluate", "--model", "run", "--data", "tiny.xyz", "--energy-key", "none",
                                             "--forces-key", "none", "--write", "pred.xyz"});
  EXPECT_EQ(write.rc, 0) << write.err;
  EXPECT_TRUE(fs::exists(dir / "pred.xyz"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace crucible
