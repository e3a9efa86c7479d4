// Issue 47: the readers bound the memory their structures hold
// (ExtxyzOptions::memory_budget_bytes), before holding more, naming the
// file and the figures; without a bound they read everything.

#include "crucible/data/deepmd.h"
#include "crucible/data/extxyz.h"
#include "crucible/common/error.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

namespace crucible {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

class MemoryBudget : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("crucible_memory_budget_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // 3000 water molecules, energy and forces.
    std::ofstream out(dir_ / "water.xyz");
    for (int k = 0; k < 3000; ++k) {
      out << "3\nenergy=-14.0 Properties=species:S:1:pos:R:3:forces:R:3 pbc=\"F F F\"\n"
          << "O 0 0 0 0.1 0 0\nH 0.96 0 0 -0.1 0 0\nH -0.24 0.93 0 0 0 0\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MemoryBudget, ExtxyzStopsAtTheFirstThousandFramesBeyondTheBudget) {
  ExtxyzOptions o;
  ASSERT_EQ(read_extxyz((dir_ / "water.xyz").string(), o).size(), 3000u);  // no bound
  // 3000 frames need 3000 × 4096 + 9000 × 56 B = 12.79 MB; a 5 MB budget is passed at frame 2048.
  o.memory_budget_bytes = 5e6;
  const std::string what = error_of([&] { read_extxyz((dir_ / "water.xyz").string(), o); });
  EXPECT_NE(what.find((dir_ / "water.xyz").string() + ":"), std::string::npos) << what;
  EXPECT_NE(what.find("the 2048 structures read so far (6144 atoms) would hold about 0.01 GB in memory"),
            std::string::npos) << what;
  EXPECT_NE(what.find("more than the 0.01 GB available"), std::string::npos) << what;
  o.memory_budget_bytes = 13e6;
  EXPECT_EQ(read_extxyz((dir_ / "water.xyz").string(), o).size(), 3000u);
}

TEST_F(MemoryBudget, DeepmdRefusesASetBeforeMakingItsFrames) {
  const std::vector<Structure> frames = read_extxyz((dir_ / "water.xyz").string());
  write_deepmd((dir_ / "dp").string(), frames);
  ExtxyzOptions o;
  const std::vector<Structure> back = read_deepmd((dir_ / "dp").string(), o);
  ASSERT_EQ(back.size(), 3000u);
  // The frames of one system share one atomic_numbers tensor, equal to the file's.
  EXPECT_TRUE(back[0].atomic_numbers.is_same(back[2999].atomic_numbers));
  EXPECT_TRUE(back[5].atomic_numbers.equal(frames[5].atomic_numbers));
  o.memory_budget_bytes = 12e6;  // 12.79 MB needed
  const std::string what = error_of([&] { read_deepmd((dir_ / "dp").string(), o); });
  EXPECT_NE(what.find("coord.npy: the 3000 structures read so far (9000 atoms) would hold about 0.01 GB"),
            std::string::npos) << what;
}

}  // namespace
}  // namespace crucible
