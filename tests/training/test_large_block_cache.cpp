// Issue 19: the CPU allocator that keeps freed large blocks (no page faults
// for a large structure's per-edge temporaries, step after step).

#include "crucible/training/allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace crucible {
namespace {

double rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0.0;
}

TEST(LargeBlockCache, AFreedLargeBlockStaysResidentAndIsReused) {
  install_large_block_cache();
  const double before = rss_mib();
  { at::ones({96 << 18}, at::kFloat); }  // 96 MiB, touched, then freed
  const double after_free = rss_mib();
  // glibc would have unmapped it (above its 32 MiB mmap ceiling).
  EXPECT_GT(after_free - before, 90.0);
  { at::ones({96 << 18}, at::kFloat); }  // the same block again: no new pages
  EXPECT_LT(rss_mib() - after_free, 4.0);
}

TEST(LargeBlockCache, ReusesAFreedLargeBlockAndServesEveryOtherRequest) {
  install_large_block_cache();
  install_large_block_cache();  // idempotent
  void* first = nullptr;
  {
    at::Tensor a = at::empty({(5 << 20) + 1000}, at::kFloat);  // 20 MiB + 4000 B: a 22 MiB block
    first = a.data_ptr();
    a.fill_(1.0);
  }
  {
    // A smaller request is cut from the front of the idle block.
    at::Tensor b = at::empty({5 << 20}, at::kFloat);
    EXPECT_EQ(b.data_ptr(), first);
    b.fill_(2.0);
    EXPECT_EQ(b.sum().item<double>(), 2.0 * b.numel());
    // Another large block while that one is alive is a different one.
    at::Tensor c = at::zeros({5 << 20}, at::kFloat);
    EXPECT_NE(c.data_ptr(), first);
    EXPECT_EQ(c.abs().sum().item<double>(), 0.0);  // zeros are written, not inherited
  }
  // Small tensors and the raw interface (used by oneDNN) go through it too.
  at::Tensor small = at::arange(10, at::kDouble);
  EXPECT_EQ(small.sum().item<double>(), 45.0);
  c10::Allocator* alloc = c10::GetCPUAllocator();
  for (size_t n : {size_t{64}, size_t{32} << 20}) {
    void* p = alloc->raw_allocate(n);
    ASSERT_NE(p, nullptr);
    static_cast<char*>(p)[n - 1] = 7;
    alloc->raw_deallocate(p);
  }
  // A bf16 matrix product (oneDNN on CPUs with bf16) on large operands. Each
  // entry sums 8 ones: exact also where bf16 is emulated and accumulates in
  // bf16 (Zen 3: a sum of 2048 ones stops at 256 there).
  const at::Tensor x = at::ones({2048, 2048}, at::kBFloat16);
  const at::Tensor y = at::zeros({2048, 2048}, at::kBFloat16);
  y.narrow(0, 0, 8).fill_(1.0);
  const at::Tensor z = at::mm(x, y);
  EXPECT_EQ(z[0][0].item<float>(), 8.0f);
  EXPECT_EQ(z[2047][2047].item<float>(), 8.0f);
}

TEST(LargeBlockCache, AFreedMediumBlockIsHandedOutAgainForItsSizeClass) {
  install_large_block_cache();
  void* first = nullptr;
  {
    at::Tensor a = at::empty({1024, 64}, at::kFloat);  // 256 KiB: an edge chunk's [1024, 64]
    first = a.data_ptr();
    a.fill_(3.0);
  }
  at::Tensor b = at::zeros({1024, 64}, at::kFloat);  // same class: the same block, zeroed
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(b.abs().sum().item<double>(), 0.0);
  at::Tensor c = at::empty({1023, 64}, at::kFloat);  // 255.75 KiB: the same class, while b holds that block
  EXPECT_NE(c.data_ptr(), first);
  c.fill_(1.0);
  EXPECT_EQ(c.sum().item<double>(), 1023.0 * 64.0);
  void* second = c.data_ptr();
  c = at::Tensor();
  at::Tensor d = at::empty({1021, 64}, at::kFloat);  // 255.25 KiB: also that class
  EXPECT_EQ(d.data_ptr(), second);
  at::Tensor e = at::empty({2048, 64}, at::kFloat);  // another class: not b's or d's
  EXPECT_NE(e.data_ptr(), first);
  EXPECT_NE(e.data_ptr(), second);
  // The raw interface (oneDNN) takes and returns medium blocks too.
  c10::Allocator* alloc = c10::GetCPUAllocator();
  void* p = alloc->raw_allocate(size_t{100} << 10);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[(size_t{100} << 10) - 1] = 7;
  alloc->raw_deallocate(p);
  EXPECT_EQ(alloc->raw_allocate(size_t{100} << 10), p);
  alloc->raw_deallocate(p);
  empty_large_block_cache();  // frees the idle medium blocks (no crash, no double free)
}

// VmFlags of the /proc/self/smaps mapping that holds `address` ("" if none).
std::string vm_flags_of(const void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8);
    }
  }
  return "";
}

TEST(LargeBlockCache, LargeBlocksAre2MiBAlignedAndAskForHugePages) {
  install_large_block_cache();
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!mode) GTEST_SKIP() << "this kernel has no transparent huge pages";
  at::Tensor a = at::empty({20 << 18}, at::kFloat);  // 20 MiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % (uintptr_t{2} << 20), 0u);
  const std::string flags = vm_flags_of(a.data_ptr());
  ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds the block";
  const char* env = std::getenv("CRUCIBLE_HUGE_PAGES");
  if (env != nullptr && std::string(env) == "0") {
    EXPECT_EQ(flags.find(" hg"), std::string::npos) << "VmFlags:" << flags;  // switched off
  } else {
    EXPECT_NE(flags.find(" hg"), std::string::npos) << "VmFlags:" << flags;  // MADV_HUGEPAGE
  }
  // A small tensor stays with the previous allocator: no advice there.
  at::Tensor b = at::empty({1024}, at::kFloat);
  EXPECT_EQ(vm_flags_of(b.data_ptr()).find(" hg"), std::string::npos);
}

constexpr int64_t kMiBFloats = int64_t{1} << 18;  // float32 elements in 1 MiB

LargeBlockCacheStats stats_now() {
  LargeBlockCacheStats s;
  EXPECT_TRUE(large_block_cache_stats(&s));
  return s;
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(LargeBlockCache, SmallerRequestsAreCutFromAnIdleBlock) {
  install_large_block_cache();
  empty_large_block_cache();
  EXPECT_EQ(stats_now().cached_bytes, 0u);
  char* first = nullptr;
  { at::Tensor a = at::ones({64 * kMiBFloats}, at::kFloat); first = static_cast<char*>(a.data_ptr()); }
  const LargeBlockCacheStats before = stats_now();
  EXPECT_EQ(before.cached_bytes, size_t{64} << 20);
  at::Tensor b = at::empty({32 * kMiBFloats}, at::kFloat);
  at::Tensor c = at::empty({32 * kMiBFloats}, at::kFloat);
  EXPECT_EQ(static_cast<char*>(b.data_ptr()), first);
  EXPECT_EQ(static_cast<char*>(c.data_ptr()), first + (size_t{32} << 20));
  const long faults = minor_faults();
  b.fill_(2.0);
  c.fill_(3.0);
  EXPECT_LT(minor_faults() - faults, 64) << "the pages of the idle block were not reused";
  const LargeBlockCacheStats after = stats_now();
  EXPECT_EQ(after.fresh_bytes, before.fresh_bytes);
  EXPECT_EQ(after.cached_bytes, 0u);
  EXPECT_EQ(after.live_bytes - before.live_bytes, size_t{64} << 20);
  EXPECT_EQ(b.sum().item<double>(), 2.0 * b.numel());
}

TEST(LargeBlockCache, IdleBlocksAreMovedIntoALargerRequestWithTheirPages) {
  install_large_block_cache();
  empty_large_block_cache();
  {
    at::Tensor x = at::full({32 * kMiBFloats}, 1.0, at::kFloat);
    at::Tensor keep_apart = at::empty({16 * kMiBFloats}, at::kFloat);  // x and y not adjacent
    at::Tensor y = at::full({32 * kMiBFloats}, 2.0, at::kFloat);
    keep_apart.fill_(0.5);
  }
  const LargeBlockCacheStats before = stats_now();
  EXPECT_EQ(before.cached_bytes, size_t{80} << 20);
  // 96 MiB: no idle block holds it, all three together do.
  at::Tensor w = at::empty({96 * kMiBFloats}, at::kFloat);
  const LargeBlockCacheStats after = stats_now();
  EXPECT_EQ(after.fresh_bytes - before.fresh_bytes, size_t{16} << 20);
  EXPECT_EQ(after.moved_bytes - before.moved_bytes, size_t{80} << 20);
  EXPECT_GE(after.moved_pieces - before.moved_pieces, 3u);
  EXPECT_EQ(after.cached_bytes, 0u);
  // The moved pages still hold what x and y wrote (largest first: x or y,
  // then the other, then the 16 MiB block), and the fresh tail is zero:
  // they were moved, not copied into fresh pages nor left behind.
  const float first = w[0].item<float>(), second = w[32 * kMiBFloats].item<float>();
  EXPECT_TRUE((first == 1.0f && second == 2.0f) || (first == 2.0f && second == 1.0f)) << first << " " << second;
  EXPECT_EQ(w.narrow(0, 0, 32 * kMiBFloats).sum().item<double>(), first * 32.0 * kMiBFloats);
  EXPECT_EQ(w[64 * kMiBFloats].item<float>(), 0.5f);
  EXPECT_EQ(w[96 * kMiBFloats - 1].item<float>(), 0.0f);
  const long faults = minor_faults();
  w.narrow(0, 0, 80 * kMiBFloats).fill_(4.0);
  EXPECT_LT(minor_faults() - faults, 64) << "moved pages were faulted in again";
}

// Random requests between 16 and 120 MiB, some kept alive: the memory the
// cache holds never passes what the live tensors need at their peak (it maps
// nothing new while it has idle blocks), and no live tensor loses its data
// when idle blocks are cut and moved.
TEST(LargeBlockCache, HeldMemoryPeaksWhereLiveMemoryPeaks) {
  install_large_block_cache();
  empty_large_block_cache();
  std::mt19937 rng(19);
  std::uniform_int_distribution<int64_t> mib(16, 120);
  std::vector<std::pair<at::Tensor, float>> alive;
  size_t peak_live = 0, peak_held = 0;
  const size_t live0 = stats_now().live_bytes;
  for (int step = 0; step < 200; ++step) {
    if (alive.size() == 4 || (!alive.empty() && rng() % 3 == 0)) alive.erase(alive.begin() + rng() % alive.size());
    const size_t fresh_before = stats_now().fresh_bytes;
    at::Tensor t = at::empty({mib(rng) * kMiBFloats}, at::kFloat);
    const LargeBlockCacheStats s = stats_now();
    if (s.fresh_bytes > fresh_before) {
      EXPECT_EQ(s.cached_bytes, 0u) << "step " << step << ": mapped new memory while holding idle blocks";
    }
    peak_live = std::max(peak_live, s.live_bytes - live0);
    peak_held = std::max(peak_held, s.live_bytes - live0 + s.cached_bytes);
    // One mark per MiB.
    const float mark = static_cast<float>(step);
    t.view({-1, kMiBFloats}).select(1, 0).fill_(mark);
    alive.emplace_back(t, mark);
    for (const auto& [tensor, value] : alive) {
      const at::Tensor marks = tensor.view({-1, kMiBFloats}).select(1, 0);
      ASSERT_TRUE(marks.eq(value).all().item<bool>()) << "step " << step << ": a live tensor lost its data";
    }
  }
  EXPECT_EQ(peak_held, peak_live);
  EXPECT_GT(stats_now().moved_pieces, 0u);
}

TEST(LargeBlockCache, AvailableMemoryIsPositiveAndAtMostThePhysicalMemory) {
  const int64_t available = available_memory_bytes();
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  EXPECT_GT(available, 0);
  EXPECT_LE(available, static_cast<int64_t>(pages) * page);
}

}  // namespace
}  // namespace crucible
