// The memory check reads the process's cgroup limit (issue 47): inside a
// 3 GiB container it said "21.5 GiB available" (the host's free memory).
// Oracle: cgroup trees written here with known limits and usage, in the
// layouts of cgroup v1 and v2.

#include "crucible/training/allocator.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace crucible {
namespace {

namespace fs = std::filesystem;

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

class CgroupMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("crucible_cgroup_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

constexpr int64_t GiB = int64_t{1} << 30;

TEST_F(CgroupMemory, V1LimitMinusUsageLessReclaimableCache) {
  put(dir_ / "proc", "4:memory:/docker/abc\n3:cpu:/\n0::/\n");
  const fs::path cg = dir_ / "sys" / "memory" / "docker" / "abc";
  put(cg / "memory.limit_in_bytes", std::to_string(3 * GiB) + "\n");
  put(cg / "memory.usage_in_bytes", std::to_string(GiB) + "\n");
  put(cg / "memory.stat", "cache 100\ntotal_inactive_file " + std::to_string(GiB / 2) + "\n");
  put(dir_ / "sys" / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  put(dir_ / "sys" / "memory" / "memory.usage_in_bytes", std::to_string(20 * GiB) + "\n");
  const auto got = cgroup_available_bytes((dir_ / "proc").string(), (dir_ / "sys").string());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, 3 * GiB - (GiB - GiB / 2));
}

TEST_F(CgroupMemory, V2TheTightestOfTheCgroupAndItsParents) {
  put(dir_ / "proc", "0::/user.slice/job\n");
  put(dir_ / "sys" / "cgroup.controllers", "memory\n");
  const fs::path parent = dir_ / "sys" / "user.slice", child = parent / "job";
  put(child / "memory.max", "max\n");
  put(child / "memory.current", std::to_string(GiB) + "\n");
  put(parent / "memory.max", std::to_string(4 * GiB) + "\n");
  put(parent / "memory.current", std::to_string(3 * GiB) + "\n");
  put(parent / "memory.stat", "anon 1\ninactive_file 0\n");
  const auto got = cgroup_available_bytes((dir_ / "proc").string(), (dir_ / "sys").string());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, GiB);
}

TEST_F(CgroupMemory, NoLimitIsNoneAndTheHostFigureStands) {
  put(dir_ / "proc", "0::/\n");
  put(dir_ / "sys" / "cgroup.controllers", "memory\n");
  put(dir_ / "sys" / "memory.max", "max\n");
  put(dir_ / "sys" / "memory.current", "12345\n");
  EXPECT_FALSE(cgroup_available_bytes((dir_ / "proc").string(), (dir_ / "sys").string()).has_value());
  EXPECT_FALSE(cgroup_available_bytes((dir_ / "missing").string(), (dir_ / "sys").string()).has_value());
  // This machine: never more than the host's MemAvailable.
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0, host = -1;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") host = kib * 1024;
  }
  if (host > 0) EXPECT_LE(available_memory_bytes(), host + GiB / 4);  // MemAvailable moves between reads
  const auto live = cgroup_available_bytes();
  if (live) EXPECT_LE(available_memory_bytes(), *live);
}

}  // namespace
}  // namespace crucible
