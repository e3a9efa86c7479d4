// Labels found or refused (issue 47): keys a file holds that the settings do
// not name are found by the field's names and reported with the key to set.
// The files are written here in the styles of MACE (REF_*), a MOF set
// (dft_*), NequIP (total_energy) and gap_fit (energy_sigma), and read by the
// real extxyz reader.

#include "crucible/data/label_audit.h"

#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace crucible {
namespace {

namespace fs = std::filesystem;

fs::path write_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("crucible_audit_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

// Two frames of a periodic H2 cell with MACE's REF_ names for every label.
std::string ref_frames(const std::string& energy, const std::string& forces, const std::string& stress) {
  std::string text;
  for (int k = 0; k < 2; ++k) {
    text += "2\nLattice=\"5 0 0 0 5 0 0 0 5\" Properties=species:S:1:pos:R:3:" + forces + ":R:3 " + energy +
            "=-3.5 " + stress + "=\"0.1 0 0 0 0.1 0 0 0 0.1\" config_type=bulk pbc=\"T T T\"\n"
            "H 0 0 0 0.1 0 0\nH 0.74 0 0 -0.1 0 0\n";
  }
  return text;
}

TEST(LabelOfKey, FieldNamesAndNotLabels) {
  for (const char* k : {"energy", "REF_energy", "dft_energy", "DFT_energy", "free_energy", "total_energy", "TotEnergy",
                        "REF_energy_PBE", "Energy"}) {
    EXPECT_EQ(label_of_key(k), "energy") << k;
  }
  for (const char* k : {"forces", "force", "REF_forces", "dft_force", "DFT_forces"}) EXPECT_EQ(label_of_key(k), "forces") << k;
  for (const char* k : {"stress", "REF_stress", "dft_stress"}) EXPECT_EQ(label_of_key(k), "stress") << k;
  for (const char* k : {"virial", "REF_virials", "dft_virial"}) EXPECT_EQ(label_of_key(k), "virial") << k;
  // Predictions, per-atom values, weights, DFT settings: not labels.
  for (const char* k : {"MACE_energy", "crucible_energy", "energy_sigma", "virial_sigma", "energy_per_atom",
                        "energy_cutoff", "config_energy_weight", "spacegroup", "energies", "E"}) {
    EXPECT_EQ(label_of_key(k), "") << k;
  }
}

TEST(LabelAudit, EveryUnreadLabelOfAMaceStyleFileIsFoundAtOnce) {
  const fs::path p = write_file("ref.xyz", ref_frames("REF_energy", "REF_forces", "REF_stress"));
  const auto frames = read_extxyz(p.string());
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_FALSE(frames[0].energy.has_value());  // the reader read nothing under default keys
  const auto found = find_unread_labels(frames, ExtxyzOptions{});
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].label, "energy");
  EXPECT_EQ(found[0].key, "REF_energy");
  EXPECT_EQ(found[0].setting, "data.energy_key");
  EXPECT_EQ(found[0].frames, 2);
  EXPECT_EQ(found[0].first, p.string() + ":2");
  EXPECT_EQ(found[1].label, "forces");
  EXPECT_EQ(found[1].key, "REF_forces");
  EXPECT_EQ(found[2].label, "stress");
  EXPECT_EQ(found[2].setting, "data.stress_key");
  LabelAudit audit;
  audit.add(p.string(), frames, ExtxyzOptions{});
  try {
    audit.throw_if_any();
    FAIL() << "no error";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(p.string() + ": energy under 'REF_energy' in 2 of 2 frames (first at line 2; set data.energy_key=REF_energy)"),
              std::string::npos) << m;
    EXPECT_NE(m.find("set data.forces_key=REF_forces"), std::string::npos) << m;
    EXPECT_NE(m.find("set data.stress_key=REF_stress"), std::string::npos) << m;
    EXPECT_NE(m.find("data.<label>_key=none"), std::string::npos) << m;
  }
  // Setting the keys reads every label; nothing is left to find.
  ExtxyzOptions keys;
  keys.energy_key = "REF_energy";
  keys.forces_key = "REF_forces";
  keys.stress_key = "REF_stress";
  const auto read = read_extxyz(p.string(), keys);
  EXPECT_DOUBLE_EQ(*read[1].energy, -3.5);
  EXPECT_DOUBLE_EQ((*read[1].stress)[1][1].item<double>(), 0.1);
  EXPECT_TRUE(find_unread_labels(read, keys).empty());
  // none drops a label on purpose: no finding for it.
  keys.stress_key = "none";
  const auto no_stress = read_extxyz(p.string(), keys);
  EXPECT_FALSE(no_stress[0].stress.has_value());
  EXPECT_TRUE(find_unread_labels(no_stress, keys).empty());
  fs::remove(p);
}

TEST(LabelAudit, AWrongKeyOnAFileWithTheStandardKeyIsFoundAndTheKeyNamed) {
  const fs::path p = write_file("std.xyz", ref_frames("energy", "forces", "stress"));
  ExtxyzOptions keys;
  keys.energy_key = "WRONG";
  const auto frames = read_extxyz(p.string(), keys);
  const auto found = find_unread_labels(frames, keys);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].key, "energy");
  EXPECT_NE(describe_unread_labels("std.xyz", found, 2).find("set data.energy_key=energy"), std::string::npos);
  fs::remove(p);
}

TEST(LabelAudit, FramesThatHaveTheLabelAndSettingsKeysAreNotFindings) {
  // gap_fit-style keys next to a read energy; a virial kept in info because a
  // stress was read; a prediction column.
  const fs::path p = write_file(
      "gap.xyz",
      "2\nLattice=\"5 0 0 0 5 0 0 0 5\" Properties=species:S:1:pos:R:3:forces:R:3:MACE_forces:R:3 energy=-1 "
      "energy_sigma=0.001 virial_sigma=0.1 stress=\"0 0 0 0 0 0 0 0 0\" virial=\"1 0 0 0 1 0 0 0 1\" pbc=\"T T T\"\n"
      "H 0 0 0 0 0 0 0 0 0\nH 0.74 0 0 0 0 0 0 0 0\n");
  const auto frames = read_extxyz(p.string());
  EXPECT_TRUE(frames[0].info.count("virial"));
  EXPECT_TRUE(find_unread_labels(frames, ExtxyzOptions{}).empty());
  fs::remove(p);
}

}  // namespace
}  // namespace crucible
