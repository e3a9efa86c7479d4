// CheckpointStore: round trip, append/overwrite, retention, integrity,
// confinement to the directory, and crash safety.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "common/python_oracle.h"
#include "crucible/checkpoint/checkpoint_store.h"
#include "crucible/checkpoint/sha256.h"
#include "crucible/common/error.h"

namespace fs = std::filesystem;
using namespace crucible::checkpoint;
using crucible::DataError;
using json = nlohmann::json;

namespace {

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(s.data(), static_cast<std::streamsize>(s.size()));
}

/// Every byte value, some NULs, and a recognisable tag.
std::string binary_blob(const std::string& tag, std::size_t n = 3000) {
  std::string s = tag;
  s.push_back('\0');
  for (std::size_t i = 0; s.size() < n; ++i) s.push_back(static_cast<char>((i * 131 + tag.size()) & 0xFF));
  return s;
}

/// A writer that emits `n` bytes in a mix of small puts and one large write.
CheckpointFile streamed(const std::string& name, std::size_t n, unsigned seed) {
  return CheckpointFile{name, [n, seed](std::ostream& os) {
                          std::string big(n / 2, '\0');
                          for (std::size_t i = 0; i < big.size(); ++i)
                            big[i] = static_cast<char>((i * 7 + seed) & 0xFF);
                          for (std::size_t i = 0; i < n - big.size(); ++i)
                            os.put(static_cast<char>((i + seed) & 0xFF));
                          os.write(big.data(), static_cast<std::streamsize>(big.size()));
                        }};
}

std::string streamed_bytes(std::size_t n, unsigned seed) {
  std::ostringstream ss;
  streamed("x", n, seed).write(ss);
  return ss.str();
}

std::vector<CheckpointFile> files_for(const std::string& tag) {
  return {CheckpointFile::from_bytes("model.pt", binary_blob(tag)),
          CheckpointFile::from_bytes("optim/0.pt", binary_blob(tag + "-optim", 500))};
}

CheckpointFiles expected_for(const std::string& tag) {
  return {{"model.pt", binary_blob(tag)}, {"optim/0.pt", binary_blob(tag + "-optim", 500)}};
}

std::vector<std::int64_t> indices(const std::vector<CheckpointEntry>& entries) {
  std::vector<std::int64_t> out;
  for (const auto& e : entries) out.push_back(e.index);
  return out;
}

std::set<std::string> dir_names(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/crucible-ckpt-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    dir_ = base_ / "run" / "checkpoints";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }

  json manifest() const { return json::parse(read_bytes(dir_ / "manifest.json")); }
  void set_manifest(const json& j) const { write_bytes(dir_ / "manifest.json", j.dump(2)); }

  fs::path base_, dir_;
};

}  // namespace

// ---------------------------------------------------------------- round trip

TEST_F(StoreTest, RoundTripFilesCountersMetricAndTime) {
  CheckpointStore store(dir_);
  EXPECT_TRUE(store.list().empty());  // no directory yet
  CheckpointCounters c{120, 3, {{"batch_count", 130}, {"epoch_step_count", 10}}};
  const std::string model = binary_blob("model", 100000);
  std::vector<CheckpointFile> files{CheckpointFile::from_bytes("model.pt", model),
                                    streamed("optim/0.pt", 200001, 5),
                                    CheckpointFile::from_bytes("empty.bin", "")};
  const CheckpointEntry saved = store.save(-1, c, files, CheckpointMetric{"val_loss", 0.125});
  EXPECT_EQ(saved.index, 0);
  EXPECT_EQ(saved.dir, "ckpt-000000");
  EXPECT_TRUE(std::regex_match(saved.time, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << saved.time;
  ASSERT_EQ(saved.files.size(), 3u);
  EXPECT_EQ(saved.files[0].name, "model.pt");
  EXPECT_EQ(saved.files[0].size, model.size());
  EXPECT_EQ(saved.files[0].sha256, sha256_hex(model));
  EXPECT_EQ(saved.files[1].size, 200001u);
  EXPECT_EQ(saved.files[1].sha256, sha256_hex(streamed_bytes(200001, 5)));
  EXPECT_EQ(saved.files[2].size, 0u);

  // A fresh store object reads the same from disk.
  CheckpointStore reopened(dir_);
  const auto entries = reopened.list();
  ASSERT_EQ(entries.size(), 1u);
  const CheckpointEntry& e = entries[0];
  EXPECT_EQ(e.index, 0);
  EXPECT_EQ(e.dir, "ckpt-000000");
  EXPECT_EQ(e.counters.step_count, 120);
  EXPECT_EQ(e.counters.epoch_count, 3);
  EXPECT_EQ(e.counters.extra, c.extra);
  EXPECT_EQ(e.time, saved.time);
  ASSERT_TRUE(e.metric.has_value());
  EXPECT_EQ(e.metric->name, "val_loss");
  EXPECT_EQ(e.metric->value, 0.125);
  ASSERT_EQ(e.files.size(), 3u);
  EXPECT_EQ(e.files[1].sha256, saved.files[1].sha256);

  const CheckpointFiles loaded = reopened.load(0);
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded.at("model.pt"), model);
  EXPECT_EQ(loaded.at("optim/0.pt"), streamed_bytes(200001, 5));
  EXPECT_EQ(loaded.at("empty.bin"), "");
  EXPECT_EQ(reopened.load_file(0, "optim/0.pt"), streamed_bytes(200001, 5));
  EXPECT_NO_THROW(reopened.verify(0));
  EXPECT_EQ(read_bytes(dir_ / "ckpt-000000" / "model.pt"), model);
  EXPECT_THROW(reopened.load_file(0, "nope.pt"), DataError);
  ASSERT_TRUE(reopened.find(0).has_value());
  EXPECT_FALSE(reopened.find(1).has_value());
  // Only the manifest, the lock and the folder: no temporaries left.
  EXPECT_EQ(dir_names(dir_), (std::set<std::string>{".lock", "ckpt-000000", "manifest.json"}));
}

TEST_F(StoreTest, ManifestMatchesPythonJsonAndHashlib) {
  if (!crucible::testing::python_has("json,hashlib")) GTEST_SKIP() << "python3 unavailable";
  CheckpointStore store(dir_);
  store.save(-1, {1, 0, {}}, files_for("a"));
  store.save(-1, {2, 0, {{"batch_count", 9}}}, {streamed("w.bin", 70000, 3)}, CheckpointMetric{"mae", 1.5});
  const fs::path script = base_ / "check.py";
  write_bytes(script,
              "import hashlib, json, os, sys\n"
              "d = sys.argv[1]\n"
              "m = json.load(open(os.path.join(d, 'manifest.json')))\n"
              "assert m['schema_version'] == 1\n"
              "n = 0\n"
              "for c in m['checkpoints']:\n"
              "    assert c['dir'] == 'ckpt-%06d' % c['index']\n"
              "    for f in c['files']:\n"
              "        b = open(os.path.join(d, c['dir'], f['name']), 'rb').read()\n"
              "        assert len(b) == f['size'], f\n"
              "        assert hashlib.sha256(b).hexdigest() == f['sha256'], f\n"
              "        n += 1\n"
              "print('ok', n, m['checkpoints'][1]['counters']['batch_count'], m['checkpoints'][1]['metric']['value'])\n");
  EXPECT_EQ(crucible::testing::run_python(script.string() + " " + dir_.string()), "ok 3 9 1.5\n");
}

TEST_F(StoreTest, NonFiniteMetricsRoundTrip) {
  CheckpointStore store(dir_);
  store.save(-1, {}, {}, CheckpointMetric{"loss", std::numeric_limits<double>::quiet_NaN()});
  store.save(-1, {}, {}, CheckpointMetric{"loss", -std::numeric_limits<double>::infinity()});
  const auto e = store.list();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_TRUE(std::isnan(e[0].metric->value));
  EXPECT_TRUE(std::isinf(e[1].metric->value) && e[1].metric->value < 0);
  EXPECT_EQ(manifest()["checkpoints"][0]["metric"]["value"], "NaN");
}

// ---------------------------------------------------------- append/overwrite

TEST_F(StoreTest, AppendAndOverwriteSlots) {
  CheckpointStore store(dir_);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(store.save(-1, {i, 0, {}}, files_for("v" + std::to_string(i))).index, i);
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{0, 1, 2}));

  const CheckpointEntry over = store.save(1, {77, 0, {}}, files_for("new1"));
  EXPECT_EQ(over.index, 1);
  EXPECT_EQ(over.dir, "ckpt-000001.r1");
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(store.find(1)->counters.step_count, 77);
  EXPECT_EQ(store.load(1), expected_for("new1"));
  EXPECT_EQ(store.load(0), expected_for("v0"));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt-000001"));  // old revision collected
  EXPECT_EQ(store.save(1, {78, 0, {}}, files_for("newer1")).dir, "ckpt-000001.r2");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt-000001.r1"));
  EXPECT_EQ(store.load(1), expected_for("newer1"));

  EXPECT_EQ(store.save(10, {}, files_for("ten")).dir, "ckpt-000010");
  EXPECT_EQ(store.save(-1, {}, files_for("eleven")).index, 11);
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{0, 1, 2, 10, 11}));
  EXPECT_EQ(store.load(10), expected_for("ten"));
  EXPECT_THROW(store.save(-2, {}, {}), std::invalid_argument);
}

TEST_F(StoreTest, InvalidSaveArgumentsWriteNothing) {
  CheckpointStore store(dir_);
  auto bad = [&](std::vector<CheckpointFile> files) {
    EXPECT_THROW(store.save(-1, {}, files), std::invalid_argument);
  };
  bad({CheckpointFile::from_bytes("../x", "a")});
  bad({CheckpointFile::from_bytes("/abs", "a")});
  bad({CheckpointFile::from_bytes("", "a")});
  bad({CheckpointFile::from_bytes("a/b/c", "a")});
  bad({CheckpointFile::from_bytes(".hidden", "a")});
  bad({CheckpointFile::from_bytes("a", "x"), CheckpointFile::from_bytes("a", "y")});
  bad({CheckpointFile::from_bytes("a", "x"), CheckpointFile::from_bytes("a/b", "y")});
  bad({CheckpointFile{"nowriter", {}}});
  EXPECT_THROW(store.save(-1, {}, {}, CheckpointMetric{"", 1.0}), std::invalid_argument);
  EXPECT_THROW(store.save(-1, {0, 0, {{"", 1}}}, {}), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir_));
}

TEST(CheckpointNames, IsValidFileName) {
  for (const char* ok : {"model.pt", "optim/0.pt", "a", "A-b_c+d=e@f.g", "x/y"})
    EXPECT_TRUE(is_valid_file_name(ok)) << ok;
  for (const char* bad : {"", "/", "/abs", "a/", "/a", "a//b", "a/b/c", "..", ".", "../x", "x/..", "./x",
                          ".hidden", "x/.tmp", "a\\b", "a b", "a\nb", "caf\xc3\xa9"})
    EXPECT_FALSE(is_valid_file_name(bad)) << bad;
  EXPECT_FALSE(is_valid_file_name(std::string(256, 'a')));
  EXPECT_TRUE(is_valid_file_name(std::string(255, 'a')));
}

// ----------------------------------------------------------------- retention

TEST_F(StoreTest, RetentionKeepLast) {
  CheckpointStore store(dir_, RetentionPolicy{2, "", RetentionPolicy::Mode::min, 1});
  for (int i = 0; i < 5; ++i) store.save(-1, {i, 0, {}}, files_for("r" + std::to_string(i)));
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(dir_names(dir_), (std::set<std::string>{".lock", "ckpt-000003", "ckpt-000004", "manifest.json"}));
  EXPECT_EQ(store.load(3), expected_for("r3"));
  // The checkpoint just written always stays, even in an old slot.
  store.save(0, {}, files_for("old-slot"));
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{0, 3, 4}));
}

TEST_F(StoreTest, RetentionKeepBestMin) {
  CheckpointStore store(dir_, RetentionPolicy{2, "val_loss", RetentionPolicy::Mode::min, 1});
  const double losses[] = {0.5, 0.1, 0.4, 0.3, 0.6};
  for (double l : losses) store.save(-1, {}, files_for("x"), CheckpointMetric{"val_loss", l});
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{1, 3, 4}));  // best 1 + last 2
  EXPECT_TRUE(fs::exists(dir_ / "ckpt-000001"));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt-000002"));
  // Another metric's name or NaN never counts as best.
  store.save(-1, {}, files_for("x"), CheckpointMetric{"other", 0.0});
  store.save(-1, {}, files_for("x"), CheckpointMetric{"val_loss", std::nan("")});
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{1, 5, 6}));
  store.save(-1, {}, files_for("x"), CheckpointMetric{"val_loss", 0.05});
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{6, 7}));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt-000001"));
}

TEST_F(StoreTest, RetentionKeepBestMaxAndPrune) {
  CheckpointStore store(dir_);  // keep_last 0: everything stays
  const double acc[] = {0.7, 0.9, 0.8, 0.95, 0.6, 0.1};
  for (double a : acc) store.save(-1, {}, {}, CheckpointMetric{"acc", a});
  EXPECT_EQ(store.list().size(), 6u);
  store.set_retention(RetentionPolicy{1, "acc", RetentionPolicy::Mode::max, 2});
  EXPECT_EQ(store.prune(), (std::vector<std::int64_t>{0, 2, 4}));
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{1, 3, 5}));
  EXPECT_TRUE(store.prune().empty());
  EXPECT_EQ(dir_names(dir_),
            (std::set<std::string>{".lock", "ckpt-000001", "ckpt-000003", "ckpt-000005", "manifest.json"}));
}

// ----------------------------------------------------------------- integrity

class IntegrityTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreTest::SetUp();
    CheckpointStore store(dir_);
    for (int i = 0; i < 3; ++i) store.save(-1, {i, 0, {}}, files_for("c" + std::to_string(i)));
  }
};

TEST_F(IntegrityTest, OneCorruptByteIsFoundAndNewestIntactFallsBack) {
  CheckpointStore store(dir_);
  const fs::path f = dir_ / "ckpt-000002" / "model.pt";
  std::string b = read_bytes(f);
  b[1234] = static_cast<char>(b[1234] ^ 0x01);
  write_bytes(f, b);
  const std::string want = store.find(2)->files[0].sha256;
  try {
    store.load(2);
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(f.filename().string()), std::string::npos) << m;
    EXPECT_NE(m.find("ckpt-000002"), std::string::npos) << m;
    EXPECT_NE(m.find("sha256 must be " + want), std::string::npos) << m;
    EXPECT_NE(m.find("got " + sha256_hex(b)), std::string::npos) << m;
  }
  EXPECT_THROW(store.verify(2), DataError);
  const IntactCheckpoint r = store.newest_intact();
  ASSERT_TRUE(r.entry.has_value());
  EXPECT_EQ(r.entry->index, 1);
  ASSERT_EQ(r.failed.size(), 1u);
  EXPECT_EQ(r.failed[0].index, 2);
  EXPECT_NE(r.failed[0].message.find("model.pt"), std::string::npos);
  EXPECT_EQ(store.load(1), expected_for("c1"));
}

TEST_F(IntegrityTest, TruncatedFile) {
  CheckpointStore store(dir_);
  const fs::path f = dir_ / "ckpt-000002" / "optim" / "0.pt";
  fs::resize_file(f, 200);
  try {
    store.load(2);
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("optim/0.pt"), std::string::npos) << m;
    EXPECT_NE(m.find("size must be 500 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("got 200 bytes"), std::string::npos) << m;
  }
  EXPECT_EQ(store.newest_intact().entry->index, 1);
}

TEST_F(IntegrityTest, MissingFileAndEveryCheckpointBroken) {
  CheckpointStore store(dir_);
  fs::remove(dir_ / "ckpt-000002" / "model.pt");
  try {
    store.load(2);
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ckpt-000002/model.pt"), std::string::npos) << m;
    EXPECT_NE(m.find("missing"), std::string::npos) << m;
  }
  fs::remove_all(dir_ / "ckpt-000001");
  write_bytes(dir_ / "ckpt-000000" / "model.pt", "short");
  const IntactCheckpoint r = store.newest_intact();
  EXPECT_FALSE(r.entry.has_value());
  ASSERT_EQ(r.failed.size(), 3u);
  EXPECT_EQ(r.failed[0].index, 2);
  EXPECT_EQ(r.failed[1].index, 1);
  EXPECT_EQ(r.failed[2].index, 0);
}

TEST_F(IntegrityTest, ManifestSizeIsCheckedBeforeAllocating) {
  json m = manifest();
  m["checkpoints"][2]["files"][0]["size"] = 1ull << 62;  // would be a 4 EiB buffer
  set_manifest(m);
  CheckpointStore store(dir_);
  try {
    store.load(2);
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("size must be 4611686018427387904 bytes"), std::string::npos)
        << e.what();
  }
}

TEST_F(IntegrityTest, UnknownIndexNamesTheManifest) {
  CheckpointStore store(dir_);
  try {
    store.load(9);
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("manifest.json"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint 9 must be listed, got indices 0, 1, 2"), std::string::npos) << m;
  }
}

TEST_F(IntegrityTest, CorruptManifestIsADataErrorAndIsNeverOverwritten) {
  CheckpointStore store(dir_);
  const fs::path mp = dir_ / "manifest.json";
  const std::string good = read_bytes(mp);
  write_bytes(mp, good.substr(0, good.size() / 2));
  try {
    store.list();
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(std::regex_search(m, std::regex("manifest\\.json:[0-9]+: the manifest must be valid JSON"))) << m;
  }
  EXPECT_THROW(store.newest_intact(), DataError);
  EXPECT_THROW(store.save(-1, {}, files_for("z")), DataError);
  EXPECT_EQ(read_bytes(mp), good.substr(0, good.size() / 2));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt-000002"));  // nothing collected

  auto field_error = [&](const std::function<void(json&)>& edit, const std::string& expected) {
    json m = json::parse(good);
    edit(m);
    set_manifest(m);
    try {
      store.list();
      ADD_FAILURE() << "no DataError for " << expected;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind(mp.string(), 0), 0u) << e.what();
    }
  };
  field_error([](json& m) { m["schema_version"] = 2; }, "schema_version must be 1, got 2");
  field_error([](json& m) { m["checkpoints"][0]["files"][1]["size"] = "abc"; },
              "checkpoints[0].files[1].size must be a non-negative integer, got \"abc\"");
  field_error([](json& m) { m["checkpoints"][1]["files"][0]["size"] = -1; },
              "checkpoints[1].files[0].size must be a non-negative integer");
  field_error([](json& m) { m["checkpoints"][1]["files"][0]["sha256"] = "xyz"; },
              "checkpoints[1].files[0].sha256 must be 64 lowercase hex characters");
  field_error([](json& m) { m["checkpoints"][1].erase("step_count"); }, "checkpoints[1].step_count must be present");
  field_error([](json& m) { m["checkpoints"][1]["surprise"] = 1; }, "checkpoints[1].surprise must be absent");
  field_error([](json& m) { m["checkpoints"][1]["index"] = 0; }, "checkpoints[1].index must be unique");
  field_error([](json& m) { m["checkpoints"][1]["dir"] = "ckpt-000002"; },
              "checkpoints[1].dir must be \"ckpt-000001\"");
  field_error([](json& m) { m["checkpoints"][1]["dir"] = "../ckpt-000001"; }, "checkpoints[1].dir must be");
  field_error([](json& m) { m["checkpoints"] = json::object(); }, "checkpoints must be an array");
}

// -------------------------------------------- confinement to the directory

class ConfinementTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreTest::SetUp();
    CheckpointStore(dir_).save(-1, {}, {CheckpointFile::from_bytes("model.pt", "inside")});
    outside_ = base_ / "outside.bin";
    write_bytes(outside_, secret_);
  }
  /// Makes the manifest list `name` with the outside file's size and SHA-256,
  /// so the only reason a load can fail is the path check.
  void list_as_secret(const std::string& name) {
    json m = manifest();
    m["checkpoints"][0]["files"][0]["name"] = name;
    m["checkpoints"][0]["files"][0]["size"] = secret_.size();
    m["checkpoints"][0]["files"][0]["sha256"] = sha256_hex(secret_);
    set_manifest(m);
  }
  void expect_rejected(const std::string& fragment) {
    CheckpointStore store(dir_);
    try {
      store.load(0);
      ADD_FAILURE() << "loaded although " << fragment;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_THROW(store.verify(0), DataError);
    // Unsafe names make the whole manifest invalid (DataError); unsafe paths
    // only fail that checkpoint.
    try {
      EXPECT_FALSE(store.newest_intact().entry.has_value());
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  }

  const std::string secret_ = "outside secret";
  fs::path outside_;
};

TEST_F(ConfinementTest, DotDotNameIsRejected) {
  // dir_/ckpt-000000/../../../outside.bin is base_/outside.bin.
  ASSERT_TRUE(fs::equivalent(dir_ / "ckpt-000000" / ".." / ".." / ".." / "outside.bin", outside_));
  list_as_secret("../../../outside.bin");
  expect_rejected("files[0].name must be a plain relative name");
  EXPECT_THROW(CheckpointStore(dir_).list(), DataError);
}

TEST_F(ConfinementTest, AbsoluteNameIsRejected) {
  list_as_secret(outside_.string());
  expect_rejected("files[0].name must be a plain relative name");
}

TEST_F(ConfinementTest, TooDeepOrEmptyNamesAreRejected) {
  for (const std::string n : {"a/b/c", "", "a//b", ".lock", "x/../y"}) {
    list_as_secret(n);
    expect_rejected("files[0].name must be");
  }
}

TEST_F(ConfinementTest, FileSymlinkPointingOutsideIsRejectedBeforeOpen) {
  const fs::path f = dir_ / "ckpt-000000" / "model.pt";
  fs::remove(f);
  fs::create_symlink(outside_, f);
  list_as_secret("model.pt");
  expect_rejected("resolving outside it");
  expect_rejected("(not opened)");
}

TEST_F(ConfinementTest, RelativeSymlinkEscapingIsRejected) {
  const fs::path f = dir_ / "ckpt-000000" / "model.pt";
  fs::remove(f);
  fs::create_symlink("../../../outside.bin", f);
  list_as_secret("model.pt");
  expect_rejected("resolving outside it");
}

TEST_F(ConfinementTest, CheckpointFolderSymlinkPointingOutsideIsRejected) {
  const fs::path elsewhere = base_ / "elsewhere";
  fs::create_directory(elsewhere);
  write_bytes(elsewhere / "model.pt", secret_);
  fs::remove_all(dir_ / "ckpt-000000");
  fs::create_directory_symlink(elsewhere, dir_ / "ckpt-000000");
  list_as_secret("model.pt");
  expect_rejected("resolving outside it");
}

TEST_F(ConfinementTest, ManifestSymlinkPointingOutsideIsRejected) {
  const fs::path copy = base_ / "manifest-copy.json";
  fs::copy_file(dir_ / "manifest.json", copy);
  fs::remove(dir_ / "manifest.json");
  fs::create_symlink(copy, dir_ / "manifest.json");
  try {
    CheckpointStore(dir_).list();
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: the file must lie inside"), std::string::npos)
        << e.what();
  }
}

// Issue 15: a symlink inside the store is not followed either, even when it
// points inside (design.md: files are opened with O_NOFOLLOW).
TEST_F(ConfinementTest, SymlinkInsideTheDirectoryIsRefused) {
  const fs::path f = dir_ / "ckpt-000000" / "model.pt";
  write_bytes(dir_ / "ckpt-000000" / "real.bin", secret_);
  fs::remove(f);
  fs::create_symlink("real.bin", f);
  list_as_secret("model.pt");
  expect_rejected("must not be reached through a symbolic link inside the checkpoint directory");
}

TEST_F(ConfinementTest, FifoIsRejectedWithoutBlocking) {
  const fs::path f = dir_ / "ckpt-000000" / "model.pt";
  fs::remove(f);
  ASSERT_EQ(mkfifo(f.c_str(), 0644), 0);
  expect_rejected("must be a regular file");
}

// ------------------------------------------------------------ crash safety

namespace {

struct Crash : std::runtime_error {
  Crash() : std::runtime_error("simulated crash") {}
};

SaveFaultHook crash_at(const std::string& phase) {
  return [phase](const std::string& p) {
    if (p == phase) throw Crash();
  };
}

}  // namespace

class CrashTest : public StoreTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(CrashTest, CrashBeforeManifestRenameKeepsThePreviousCheckpoint) {
  CheckpointStore store(dir_);
  store.save(-1, {1, 0, {}}, files_for("before"));
  const std::string manifest_before = read_bytes(dir_ / "manifest.json");
  EXPECT_THROW(store.save(-1, {2, 0, {}}, files_for("crashed"), std::nullopt, crash_at(GetParam())), Crash);

  // The old manifest and checkpoint are untouched and still load.
  EXPECT_EQ(read_bytes(dir_ / "manifest.json"), manifest_before);
  CheckpointStore after(dir_);
  EXPECT_EQ(indices(after.list()), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(after.load(0), expected_for("before"));
  const IntactCheckpoint r = after.newest_intact();
  ASSERT_TRUE(r.entry.has_value());
  EXPECT_EQ(r.entry->index, 0);
  EXPECT_TRUE(r.failed.empty());
  // The crash left debris behind (so the simulation is real) ...
  const std::set<std::string> clean{".lock", "ckpt-000000", "manifest.json"};
  EXPECT_NE(dir_names(dir_), clean);
  // ... which the next save ignores and removes.
  const CheckpointEntry e = after.save(-1, {3, 0, {}}, files_for("next"));
  EXPECT_EQ(e.index, 1);
  EXPECT_EQ(after.load(1), expected_for("next"));
  EXPECT_EQ(after.load(0), expected_for("before"));
  EXPECT_EQ(dir_names(dir_), (std::set<std::string>{".lock", "ckpt-000000", "ckpt-000001", "manifest.json"}));
}

INSTANTIATE_TEST_SUITE_P(Phases, CrashTest,
                         ::testing::Values("file_written:model.pt", "file_written:optim/0.pt",
                                           "folder_renamed", "manifest_written"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST_F(StoreTest, CrashWhileOverwritingKeepsTheOldSlot) {
  CheckpointStore store(dir_);
  store.save(0, {}, files_for("old"));
  EXPECT_THROW(store.save(0, {}, files_for("new"), std::nullopt, crash_at("manifest_written")), Crash);
  EXPECT_EQ(store.find(0)->dir, "ckpt-000000");
  EXPECT_EQ(store.load(0), expected_for("old"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt-000000.r1"));  // the orphaned new revision
  store.collect_garbage();
  EXPECT_FALSE(fs::exists(dir_ / "ckpt-000000.r1"));
  EXPECT_EQ(store.load(0), expected_for("old"));
}

TEST_F(StoreTest, CrashAfterManifestRenameHasTheNewCheckpoint) {
  CheckpointStore store(dir_);
  store.save(0, {}, files_for("old"));
  EXPECT_THROW(store.save(0, {}, files_for("new"), std::nullopt, crash_at("manifest_renamed")), Crash);
  EXPECT_EQ(store.find(0)->dir, "ckpt-000000.r1");
  EXPECT_EQ(store.load(0), expected_for("new"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt-000000"));  // not yet collected
  write_bytes(dir_ / "notes.txt", "not ours");
  store.collect_garbage();
  EXPECT_EQ(dir_names(dir_), (std::set<std::string>{".lock", "ckpt-000000.r1", "manifest.json", "notes.txt"}));
}

TEST_F(StoreTest, ProcessKilledBeforeManifestRename) {
  // A real crash: the child process dies inside save() with _Exit, so no
  // destructor or cleanup runs.
  CheckpointStore store(dir_);
  store.save(-1, {}, files_for("before"));
  EXPECT_EXIT(
      {
        CheckpointStore child(dir_);
        child.save(-1, {}, files_for("lost"), std::nullopt, [](const std::string& p) {
          if (p == "manifest_written") std::_Exit(42);
        });
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(42), "");
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(store.load(0), expected_for("before"));
  bool manifest_tmp = false;
  for (const auto& n : dir_names(dir_)) manifest_tmp = manifest_tmp || n.rfind(".manifest.json.tmp-", 0) == 0;
  EXPECT_TRUE(manifest_tmp);
  EXPECT_TRUE(fs::exists(dir_ / "ckpt-000001"));  // orphan folder
  store.save(-1, {}, files_for("after"));         // takes the lock the dead child held
  EXPECT_EQ(store.load(1), expected_for("after"));
  EXPECT_EQ(dir_names(dir_), (std::set<std::string>{".lock", "ckpt-000000", "ckpt-000001", "manifest.json"}));
}

TEST_F(StoreTest, WriterErrorsCleanUpAndKeepThePrevious) {
  CheckpointStore store(dir_);
  store.save(-1, {}, files_for("before"));
  const std::set<std::string> clean = dir_names(dir_);
  std::vector<CheckpointFile> throwing = files_for("x");
  throwing.push_back(CheckpointFile{"boom.pt", [](std::ostream& os) {
                                      os << "partial";
                                      throw std::runtime_error("writer failed");
                                    }});
  EXPECT_THROW(store.save(-1, {}, throwing), std::runtime_error);
  EXPECT_EQ(dir_names(dir_), clean);
  std::vector<CheckpointFile> failing{CheckpointFile{"bad.pt", [](std::ostream& os) {
                                        os << "partial";
                                        os.setstate(std::ios::badbit);
                                      }}};
  EXPECT_THROW(store.save(-1, {}, failing), std::system_error);
  EXPECT_EQ(dir_names(dir_), clean);
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(store.load(0), expected_for("before"));
}

TEST_F(StoreTest, LeftoversAreIgnoredByReaders) {
  CheckpointStore store(dir_);
  store.save(-1, {}, files_for("a"));
  fs::create_directory(dir_ / ".tmp-ckpt-000001-1-deadbeef");
  write_bytes(dir_ / ".tmp-ckpt-000001-1-deadbeef" / "model.pt", "junk");
  fs::create_directory(dir_ / "ckpt-000005");
  write_bytes(dir_ / ".manifest.json.tmp-1-deadbeef", "{not json");
  EXPECT_EQ(indices(store.list()), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(store.newest_intact().entry->index, 0);
  EXPECT_EQ(store.save(-1, {}, files_for("b")).index, 1);  // not 6: ckpt-000005 is not listed
  EXPECT_EQ(dir_names(dir_), (std::set<std::string>{".lock", "ckpt-000000", "ckpt-000001", "manifest.json"}));
}

TEST_F(StoreTest, OneWriterAtATime) {
  CheckpointStore a(dir_), b(dir_);
  a.save(-1, {}, files_for("a0"));
  bool refused = false;
  a.save(-1, {}, files_for("a1"), std::nullopt, [&](const std::string& phase) {
    if (phase != "folder_renamed") return;
    try {
      b.save(-1, {}, files_for("b"));
    } catch (const std::runtime_error& e) {
      refused = std::string(e.what()).find("locked") != std::string::npos;
    }
  });
  EXPECT_TRUE(refused);
  EXPECT_EQ(indices(b.list()), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(b.save(-1, {}, files_for("b")).index, 2);  // lock released after a's save
}
