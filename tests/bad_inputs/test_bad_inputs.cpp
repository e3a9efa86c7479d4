// Issue 8: the catalog of malformed inputs (tests/bad_inputs/). Every file
// listed in catalog.json is given to the real `crucible` binary the way a
// user would give it; each must end with a non-zero exit, the exact error
// line recorded in the catalog, a peak resident memory below 1 GiB, and no
// run directory written. Also: a manifest naming `../../outside` is refused
// without anything outside the checkpoint directory being opened (watched
// with inotify), and the fuzzers' kept findings (fuzz/regressions/) still
// give their expected error type in process.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/inotify.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <set>
#include <regex>
#include <string>
#include <vector>

#include "bad_inputs/run_binary.h"
#include "checkpoint/manifest.h"
#include "crucible/common/error.h"
#include "crucible/config/config.h"
#include "crucible/data/extxyz.h"

namespace fs = std::filesystem;

namespace {

using namespace crucible::testing;

const fs::path kCatalog = fs::path(CRUCIBLE_SOURCE_DIR) / "tests" / "bad_inputs";
constexpr long kMaxRssKib = 1024L * 1024L;  // 1 GiB

std::string substitute(std::string s, const std::string& key, const std::string& value) {
  for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + value.size())) {
    s.replace(at, key.size(), value);
  }
  return s;
}

class BadInputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fs::exists(CRUCIBLE_BINARY)) << CRUCIBLE_BINARY << " must be built";
    work_ = fs::temp_directory_path() / ("crucible_bad_inputs_" + std::to_string(::getpid()));
    fs::remove_all(work_);
    fs::create_directories(work_);
    write_text(work_ / "tiny.xyz", tial_frames(10));
    // A run with checkpoints, made unfinished (no summary.json) so that
    // --resume reads its manifest: the template of the manifest cases.
    auto args = tiny_training_args(work_ / "tiny.xyz", work_ / "template");
    args.push_back("training.num_epochs=1");
    const Outcome o = run_crucible(work_, args);
    ASSERT_EQ(o.rc, 0) << o.err;
    ASSERT_TRUE(fs::exists(work_ / "template" / "checkpoints" / "manifest.json"));
    fs::remove(work_ / "template" / "summary.json");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(work_, ec);
  }

  /// Runs one catalog case in a fresh folder; returns the outcome and the
  /// placeholders of its expected error.
  static Outcome run_case(const std::string& kind, const fs::path& file, fs::path* run_dir, fs::path* cwd) {
    const fs::path dir = work_ / ("case_" + std::to_string(counter_++));
    fs::create_directories(dir);
    *cwd = dir;
    *run_dir = dir / "run";
    if (kind == "data") {
      return run_crucible(dir, {"train", "data.train_file=" + file.string(), "output.run_dir=" + run_dir->string()});
    }
    if (kind == "config") {
      return run_crucible(dir, {"train", "--config", file.string(), "output.run_dir=" + run_dir->string()});
    }
    if (kind == "spec") return run_crucible(dir, {"spec", "validate", file.string()});
    if (kind == "manifest") {
      fs::copy(work_ / "template", *run_dir, fs::copy_options::recursive);
      fs::copy_file(file, *run_dir / "checkpoints" / "manifest.json", fs::copy_options::overwrite_existing);
      return run_crucible(dir, {"train", "--resume", run_dir->string()});
    }
    ADD_FAILURE() << "unknown catalog kind '" << kind << "'";
    return {};
  }

  static fs::path work_;
  static int counter_;
};

fs::path BadInputs::work_;
int BadInputs::counter_ = 0;

TEST_F(BadInputs, EveryCatalogFileGivesItsExactErrorANonZeroExitAndStaysBelowOneGiB) {
  const auto catalog = nlohmann::json::parse(read_text(kCatalog / "catalog.json"));
  ASSERT_GE(catalog.at("cases").size(), 30u);
  // Every file of the catalog folders is listed, and every listed file exists.
  std::set<std::string> listed;
  for (const auto& c : catalog.at("cases")) listed.insert(c.at("file").get<std::string>());
  for (const char* sub : {"data", "configs", "specs", "manifests"}) {
    for (const auto& e : fs::directory_iterator(kCatalog / sub)) {
      const std::string rel = std::string(sub) + "/" + e.path().filename().string();
      EXPECT_TRUE(listed.count(rel)) << rel << " is in the catalog folder but not in catalog.json";
    }
  }
  for (const auto& c : catalog.at("cases")) {
    const std::string rel = c.at("file");
    SCOPED_TRACE(rel);
    const fs::path file = kCatalog / rel;
    ASSERT_TRUE(fs::exists(file));
    fs::path run_dir, cwd;
    const Outcome o = run_case(c.at("kind"), file, &run_dir, &cwd);
    EXPECT_EQ(o.rc, c.at("exit").get<int>()) << o.err;
    EXPECT_NE(o.rc, 0);
    if (c.contains("error_regex")) {  // figures that depend on the machine (free memory)
      EXPECT_TRUE(std::regex_match(last_line(o.err), std::regex(c.at("error_regex").get<std::string>())))
          << last_line(o.err);
    } else {
      std::string expected = c.at("error");
      expected = substitute(expected, "{cwd}", cwd.string());
      expected = substitute(expected, "{file}", file.string());
      expected = substitute(expected, "{run}", run_dir.string());
      expected = substitute(expected, "{source}", std::string(CRUCIBLE_SOURCE_DIR));
      EXPECT_EQ(last_line(o.err), expected);
    }
    EXPECT_LT(o.max_rss_kib, kMaxRssKib) << "peak RSS " << o.max_rss_kib << " KiB";
    if (c.at("kind") != "manifest") {
      EXPECT_FALSE(fs::exists(run_dir)) << "a run directory was written for bad input";
    }
  }
}

// Acceptance: a manifest naming ../../outside is rejected, and nothing
// outside the checkpoint directory is opened. The outside files exist at
// every place the name could resolve to; inotify reports any open of them.
TEST_F(BadInputs, ManifestPointingOutsideIsRejectedAndNothingOutsideIsOpened) {
  const fs::path dir = work_ / "outside_case";
  const fs::path run = dir / "run";
  fs::create_directories(dir);
  fs::copy(work_ / "template", run, fs::copy_options::recursive);
  fs::copy_file(kCatalog / "manifests" / "01_file_name_dot_dot_outside.json", run / "checkpoints" / "manifest.json",
                fs::copy_options::overwrite_existing);
  // ckpt-000001/../../outside = run/outside; checkpoints/../../outside = dir/outside.
  write_text(run / "outside", "secret");
  write_text(dir / "outside", "secret");

  const int in = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(in, 0);
  ASSERT_GE(::inotify_add_watch(in, run.c_str(), IN_OPEN | IN_ACCESS), 0);
  ASSERT_GE(::inotify_add_watch(in, dir.c_str(), IN_OPEN | IN_ACCESS), 0);
  const Outcome o = run_crucible(dir, {"train", "--resume", run.string()});
  EXPECT_NE(o.rc, 0);
  EXPECT_NE(o.err.find("../../outside"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("a plain relative name"), std::string::npos) << o.err;

  std::vector<std::string> opened;
  alignas(struct inotify_event) char buf[1 << 16];
  ssize_t n;
  while ((n = ::read(in, buf, sizeof buf)) > 0) {
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<struct inotify_event*>(p);
      if (ev->len > 0) opened.emplace_back(ev->name);
      p += sizeof(struct inotify_event) + ev->len;
    }
  }
  ::close(in);
  for (const auto& name : opened) EXPECT_NE(name, "outside") << "a file outside the checkpoints was opened";
  // The watch works: the run's own files inside `run` were opened (config.yaml at least).
  EXPECT_FALSE(opened.empty());
}

// The fuzzers' kept findings (fuzz/regressions/<target>/) give their
// parser's own error type, in process, like any bad input.
TEST(FuzzRegressions, KeptFindingsGiveTheirParsersError) {
  const fs::path root = fs::path(CRUCIBLE_SOURCE_DIR) / "fuzz" / "regressions";
  int checked = 0;
  auto each = [&](const char* target, auto&& parse) {
    const fs::path dir = root / target;
    if (!fs::exists(dir)) return;
    for (const auto& e : fs::directory_iterator(dir)) {
      SCOPED_TRACE(e.path().string());
      parse(read_text(e.path()));
      ++checked;
    }
  };
  each("extxyz", [](const std::string& t) {
    try {
      (void)crucible::read_extxyz_text(t, "regression.xyz");
    } catch (const crucible::DataError&) {
    }
  });
  each("config_yaml", [](const std::string& t) {
    try {
      crucible::Config c = crucible::default_config();
      crucible::apply_config_yaml(c, t, "regression.yaml");
      crucible::validate_config(c);
    } catch (const crucible::ConfigError&) {
    }
  });
  each("spec_json", [](const std::string& t) {
    try {
      (void)crucible::config_from_spec_json(t, "regression.json");
    } catch (const crucible::ConfigError&) {
    }
  });
  each("manifest", [](const std::string& t) {
    try {
      (void)crucible::checkpoint::detail::parse_manifest(t, "regression/manifest.json");
    } catch (const crucible::DataError&) {
    }
  });
  EXPECT_GE(checked, 2);  // fuzz/regressions/ holds the findings of issue 8's fuzzing
  std::cout << checked << " kept fuzz findings replayed\n";
}

}  // namespace
