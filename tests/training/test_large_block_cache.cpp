// Issue 19: the CPU allocator that keeps freed large blocks (no page faults
// for a large structure's per-edge temporaries, step after step).

#include "crucible/training/allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

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
    // A smaller request, within 1.5x of the cached block's size, reuses it.
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

TEST(LargeBlockCache, GivesBackWhatTheKernelLacksToServeARequest) {
  constexpr size_t GiB = size_t{1} << 30, MiB = size_t{1} << 20;
  // 24 GiB machine: keep 1.5 GiB to spare.
  EXPECT_EQ(bytes_to_yield(GiB, 3 * GiB, 24 * GiB), 0u);
  EXPECT_EQ(bytes_to_yield(GiB, GiB / 2 * 5, 24 * GiB), 0u);  // exactly enough
  EXPECT_EQ(bytes_to_yield(GiB, 2 * GiB, 24 * GiB), GiB / 2);
  EXPECT_EQ(bytes_to_yield(4 * GiB, 3 * GiB, 24 * GiB), GiB / 2 * 5);
  EXPECT_EQ(bytes_to_yield(16 * MiB, 0, 16 * GiB), 16 * MiB + GiB);
  // MemAvailable is read: positive and at most the machine's memory.
  const int64_t available = available_memory_bytes();
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  EXPECT_GT(available, 0);
  EXPECT_LE(available, static_cast<int64_t>(pages) * page);
}

}  // namespace
}  // namespace crucible
