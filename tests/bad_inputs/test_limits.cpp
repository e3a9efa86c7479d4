// Issue 15: limits instead of trust, through the real binary. Inputs that
// cannot live in the catalog folder (a FIFO, a device, a symlink loop) or
// whose message names this machine's cores or memory: each is refused in
// under 5 s with a one-line error naming the file or key and the bound, with
// peak resident memory under 1 GiB, and nothing is written.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "bad_inputs/run_binary.h"

namespace {

using namespace crucible::testing;
namespace fs = std::filesystem;

constexpr long kLimitsMaxRssKib = 1024 * 1024;

class Limits : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_dir("crucible_limits");
    write_text(dir_ / "tiny.xyz", tial_frames(10));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  /// Runs `crucible train` with `overrides`; expects exit 1 within 5 s and
  /// a last stderr line containing `needle`; nothing written to the run dir.
  void expect_refused(const std::vector<std::string>& overrides, const std::string& needle) {
    SCOPED_TRACE(needle);
    const fs::path run = dir_ / "run";
    std::vector<std::string> args{"train", "output.run_dir=" + run.string()};
    args.insert(args.end(), overrides.begin(), overrides.end());
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = run_crucible(dir_, args);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(o.rc, 1) << o.err;
    const std::string line = last_line(o.err);
    EXPECT_EQ(line.rfind("crucible: error: ", 0), 0u) << line;
    EXPECT_NE(line.find(needle), std::string::npos) << line;
    EXPECT_LT(seconds, 5.0);
    EXPECT_LT(o.max_rss_kib, kLimitsMaxRssKib);
    EXPECT_FALSE(fs::exists(run));
  }
  fs::path dir_;
};

TEST_F(Limits, DataFilesMustBeRegularFiles) {
  const fs::path fifo = dir_ / "pipe.xyz";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused({"data.train_file=" + fifo.string()},
                 "data.train_file file '" + fifo.string() + "' is a FIFO (named pipe)");
  expect_refused({"data.train_file=/dev/zero"}, "data.train_file file '/dev/zero' is a device");
  expect_refused({"data.train_file=" + dir_.string()}, "is a directory without a DeePMD system (type.raw in it or up to 16 levels below)");
  fs::create_symlink(dir_ / "b.xyz", dir_ / "a.xyz");
  fs::create_symlink(dir_ / "a.xyz", dir_ / "b.xyz");
  expect_refused({"data.train_file=" + (dir_ / "a.xyz").string()},
                 "data.train_file file '" + (dir_ / "a.xyz").string() + "' cannot be read (");
}

TEST_F(Limits, SizesAreCheckedFromTheKeysBeforeAllocation) {
  const std::string data = "data.train_file=" + (dir_ / "tiny.xyz").string();
  expect_refused({data, "training.num_threads=100000"}, "training.num_threads must be <= ");
  expect_refused({data, "model.schnet.hidden_channels=1000000000"},
                 "the model.schnet keys (model.schnet.hidden_channels, model.schnet.num_filters");
  expect_refused({data, "model.type=mace", "model.mace.hidden_irreps=100000x0e+100000x1o"},
                 "the model.mace keys (model.mace.hidden_irreps");
  expect_refused({data, "model.cutoff=1000"},
                 "with model.cutoff = 1000 Å the neighbor lists would hold about");
}

}  // namespace
