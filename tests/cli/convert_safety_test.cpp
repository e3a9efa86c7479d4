// Issue 47 deliverable 7, `crucible convert`: no file destroyed. An existing
// output is refused unless --overwrite, the input is never written over, the
// temporary name is the process's own (an unrelated OUT.db.tmp survives), and
// a failed write leaves neither the output nor a temporary file behind.

#include "crucible/cli/commands.h"
#include "crucible/common/error.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

namespace crucible {
namespace {

using namespace e2e;

const char* kTwoFrames =
    "2\nLattice=\"5 0 0 0 5 0 0 0 5\" Properties=species:S:1:pos:R:3:forces:R:3 energy=-1.5 pbc=\"T T T\"\n"
    "Al 0 0 0 0.1 0 0\nTi 1.5 1.5 1.5 -0.1 0 0\n"
    "2\nLattice=\"5 0 0 0 5 0 0 0 5\" Properties=species:S:1:pos:R:3:forces:R:3 energy=-1.4 pbc=\"T T T\"\n"
    "Al 0 0 0.1 0.2 0 0\nTi 1.5 1.5 1.6 -0.2 0 0\n";

class ConvertSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("crucible_convert_safety_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_text(dir_ / "in.xyz", kTwoFrames);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string convert(const std::string& in, const std::string& out, bool overwrite = false) {
    ConvertRequest r;
    r.input = in;
    r.output = out;
    r.overwrite = overwrite;
    std::ostringstream sink;
    try {
      run_convert(r, sink);
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  }
  /// Names in dir_ (for "no temporary file left").
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(ConvertSafety, AnExistingOutputIsRefusedUnlessOverwriteAndKeptIntact) {
  const fs::path out = dir_ / "out.xyz";
  write_text(out, "precious\n");
  const std::string e = convert((dir_ / "in.xyz").string(), out.string());
  EXPECT_EQ(e, out.string() + ": exists; nothing is overwritten (choose a new name, or pass --overwrite to replace it)");
  EXPECT_EQ(read_text(out), "precious\n");
  EXPECT_EQ(convert((dir_ / "in.xyz").string(), out.string(), true), "");
  EXPECT_EQ(frames_of(out.string()).size(), 2u);
  EXPECT_EQ(listing(), (std::vector<std::string>{"in.xyz", "out.xyz"}));
}

TEST_F(ConvertSafety, TheInputIsNeverWrittenOver) {
  const std::string in = (dir_ / "in.xyz").string();
  for (bool overwrite : {false, true}) {
    EXPECT_EQ(convert(in, in, overwrite),
              in + ": is the input itself; convert writes a new file, choose another output name");
    // Through another spelling of the same file, too.
    EXPECT_NE(convert(in, (dir_ / "." / "in.xyz").string(), overwrite), "");
    EXPECT_EQ(read_text(in), kTwoFrames);
  }
}

TEST_F(ConvertSafety, AnUnrelatedTmpFileSurvivesAndAFailedWriteLeavesNothing) {
  write_text(dir_ / "o.db.tmp", "someone else's\n");
  EXPECT_EQ(convert((dir_ / "in.xyz").string(), (dir_ / "o.db").string()), "");
  EXPECT_EQ(read_text(dir_ / "o.db.tmp"), "someone else's\n");
  EXPECT_TRUE(fs::exists(dir_ / "o.db"));

  // DeePMD cannot hold a slab (pbc T T F): the write fails half-way through
  // the checks; neither the output nor a temporary name remains.
  write_text(dir_ / "slab.xyz",
             "2\nLattice=\"5 0 0 0 5 0 0 0 20\" Properties=species:S:1:pos:R:3 energy=-1.5 pbc=\"T T F\"\n"
             "Al 0 0 0\nTi 1.5 1.5 1.5\n");
  const auto before = listing();
  const std::string e = convert((dir_ / "slab.xyz").string(), (dir_ / "dp").string());
  EXPECT_NE(e.find("DeePMD systems are periodic in all directions or none"), std::string::npos) << e;
  EXPECT_EQ(listing(), before);
}

// Issue 47: file-system failures were a raw "filesystem error" with exit 2.
// In a folder nothing may be created in (chattr +i; skipped where the file
// system or the user cannot set it) every writer gives one line, exit 1,
// naming the path and the cause.
TEST_F(ConvertSafety, AFolderThatCannotBeWrittenIsOneLineNamingThePath) {
  const fs::path locked = dir_ / "locked";
  fs::create_directories(locked);
  if (std::system(("chattr +i " + shell_quote(locked.string()) + " 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "chattr +i is not available here";
  }
  for (const std::string out : {"out.xyz", "out.db", "out_deepmd"}) {
    SCOPED_TRACE(out);
    const Result r = run_crucible(dir_, {"convert", "in.xyz", (locked / out).string()});
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.find("filesystem error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(locked.string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Operation not permitted"), std::string::npos) << r.err;
  }
  const Result run = run_crucible(dir_, {"train", "data.train_file=in.xyz", "data.valid_file=in.xyz",
                                         "output.run_dir=" + (locked / "run").string()});
  EXPECT_EQ(run.rc, 1);
  EXPECT_NE(run.err.find((locked / "run").string() + ": run directory cannot be created (Operation not permitted)"),
            std::string::npos)
      << run.err;
  (void)std::system(("chattr -i " + shell_quote(locked.string())).c_str());
}

}  // namespace
}  // namespace crucible
