// Label keys that match nothing (issue 18): the message lists the file's
// keys and the MACE name that would match; train and evaluate stop.

#include "crucible/run/label_keys.h"

#include "cli/e2e_helpers.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

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
  std::string valid = e2e::read_text(dir / "tiny_valid.xyz");
  valid = std::regex_replace(valid, std::regex(" energy="), " dft_energy=");
  valid = std::regex_replace(valid, std::regex(":force:R:3"), ":dft_force:R:3");
  e2e::write_text(dir / "dft_valid.xyz", valid);  // the standard-key tiny_valid.xyz would be refused (issue 47)
  const auto forces = e2e::run_crucible(dir, {"train", "data.train_file=dft.xyz", "data.energy_key=dft_energy",
                                              "training.num_epochs=1", "output.run_dir=run"});
  EXPECT_EQ(forces.rc, 1);
  EXPECT_NE(forces.err.find("dft.xyz: forces under 'dft_force' in "), std::string::npos) << forces.err;
  EXPECT_NE(forces.err.find("set data.forces_key=dft_force"), std::string::npos) << forces.err;
  EXPECT_FALSE(fs::exists(dir / "run"));
  const auto energy = e2e::run_crucible(dir, {"train", "data.train_file=dft.xyz", "data.forces_key=dft_force",
                                              "training.num_epochs=1", "output.run_dir=run"});
  EXPECT_EQ(energy.rc, 1);
  EXPECT_NE(energy.err.find("set data.energy_key=dft_energy"), std::string::npos) << energy.err;
  const auto ok = e2e::run_crucible(dir, {"train", "data.train_file=dft.xyz", "data.forces_key=dft_force",
                                          "data.energy_key=dft_energy", "data.valid_file=dft_valid.xyz",
                                          "training.num_epochs=1", "output.run_dir=run"});
  ASSERT_EQ(ok.rc, 0) << ok.err;
  // evaluate with the model's keys (energy, forces) on the dft_* file: an error.
  const auto eval = e2e::run_crucible(dir, {"evaluate", "--model", "run", "--data", "tiny.xyz"});
  EXPECT_EQ(eval.rc, 1) << eval.out;
  EXPECT_NE(eval.err.find("tiny.xyz: energy under 'energy' in "), std::string::npos) << eval.err;
  EXPECT_NE(eval.err.find("set data.energy_key=energy"), std::string::npos) << eval.err;
  EXPECT_NE(eval.err.find("forces under 'force' in "), std::string::npos) << eval.err;  // both at once
  // Only predictions: fine.
  const auto write = e2e::run_crucible(dir, {"evaluate", "--model", "run", "--data", "tiny.xyz", "--energy-key", "none",
                                             "--forces-key", "none", "--write", "pred.xyz"});
  EXPECT_EQ(write.rc, 0) << write.err;
  EXPECT_TRUE(fs::exists(dir / "pred.xyz"));
  fs::remove_all(dir);
}

// Issue 47: every label under a key the settings do not name is reported in
// one message, in train, evaluate and convert; nothing is written.
TEST(LabelKeysEndToEnd, UnreadLabelsOfEveryFileAreRefusedAtOnceInTrainEvaluateAndConvert) {
  const fs::path dir = fs::temp_directory_path() / ("crucible_unread_" + std::to_string(::getpid()));
  ASSERT_TRUE(e2e::make_tiny_tial_dir(dir));
  std::string text = e2e::read_text(dir / "tiny.xyz");
  // MOF-style file: REF_energy, a REF_forces column, REF_virials (TiAl's virial).
  std::string ref = std::regex_replace(text, std::regex(" energy="), " REF_energy=");
  ref = std::regex_replace(ref, std::regex(":force:R:3"), ":REF_forces:R:3");
  ref = std::regex_replace(ref, std::regex(" virial="), " REF_virials=");
  e2e::write_text(dir / "ref.xyz", ref);
  // A validation file whose stress is under dft_stress (energy and forces read).
  e2e::write_text(dir / "valid_dft.xyz", std::regex_replace(e2e::read_text(dir / "tiny_valid.xyz"),
                                                           std::regex(" virial="), " dft_stress="));
  const auto train = e2e::run_crucible(dir, {"train", "data.train_file=ref.xyz", "data.valid_file=valid_dft.xyz",
                                             "training.num_epochs=1", "output.run_dir=run"});
  EXPECT_EQ(train.rc, 1);
  for (const char* part : {"set data.energy_key=REF_energy", "set data.forces_key=REF_forces",
                           "set data.virial_key=REF_virials", "valid_dft.xyz: stress under 'dft_stress'"}) {
    EXPECT_NE(train.err.find(part), std::string::npos) << part << "\n" << train.err;
  }
  EXPECT_EQ(std::count(train.err.begin(), train.err.end(), '\n'), 1) << train.err;  // one line
  EXPECT_FALSE(fs::exists(dir / "run"));
  // convert: refused, no output; with the keys, every label arrives.
  const auto convert = e2e::run_crucible(dir, {"convert", "ref.xyz", "out.xyz"});
  EXPECT_EQ(convert.rc, 1);
  EXPECT_NE(convert.err.find("set data.forces_key=REF_forces"), std::string::npos) << convert.err;
  EXPECT_FALSE(fs::exists(dir / "out.xyz"));
  const auto keyed = e2e::run_crucible(dir, {"convert", "ref.xyz", "out.xyz", "data.energy_key=REF_energy",
                                             "data.forces_key=REF_forces", "data.virial_key=REF_virials"});
  ASSERT_EQ(keyed.rc, 0) << keyed.err;
  const size_t n = e2e::frames_of((dir / "tiny.xyz").string()).size();
  EXPECT_NE(keyed.out.find(fmt::format("(energy {0}, forces {0}, stress {0})", n)), std::string::npos) << keyed.out;
  // none leaves a label out on purpose.
  const auto dropped = e2e::run_crucible(dir, {"convert", "ref.xyz", "nostress.xyz", "data.energy_key=REF_energy",
                                               "data.forces_key=REF_forces", "data.virial_key=none"});
  ASSERT_EQ(dropped.rc, 0) << dropped.err;
  EXPECT_NE(dropped.out.find(fmt::format("(energy {0}, forces {0}, stress 0)", n)), std::string::npos) << dropped.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace crucible
