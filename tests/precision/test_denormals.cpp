// Flush-to-zero of denormals while Crucible computes (common/denormals.h):
// the caller and every intra-op thread flush inside a guard, arithmetic on
// denormals then gives exact zeros, nesting keeps the outer setting, the
// caller's setting comes back after it, and CRUCIBLE_KEEP_DENORMALS=1 opts out.

#include "crucible/common/denormals.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

namespace crucible {
namespace {

// A float32 / float64 denormal times one: the denormal itself without the
// flush, +0 with it (DAZ reads the input as 0, FTZ flushes the result).
bool float_product_flushed() {
  volatile float tiny = std::numeric_limits<float>::min() / 8.0f;  // 1.5e-39, denormal
  volatile float one = 1.0f;
  const float r = tiny * one;
  return r == 0.0f;
}
bool double_product_flushed() {
  volatile double tiny = std::numeric_limits<double>::min() / 8.0;  // 2.8e-309, denormal
  volatile double one = 1.0;
  const double r = tiny * one;
  return r == 0.0;
}

/// Per intra-op thread (index at::get_thread_num()): flushed or not; -1 if
/// that thread ran no chunk.
std::vector<int> flushed_per_thread() {
  const int64_t n = at::get_num_threads();
  std::vector<int> out(static_cast<size_t>(n), -1);
  std::mutex m;
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    const bool f = denormals_flushed_on_this_thread() && float_product_flushed() && double_product_flushed();
    std::lock_guard<std::mutex> lock(m);
    out[static_cast<size_t>(at::get_thread_num())] = f ? 1 : 0;
  });
  return out;
}

class Denormals : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!denormal_flush_supported()) GTEST_SKIP() << "no MXCSR on this architecture";
    unsetenv("CRUCIBLE_KEEP_DENORMALS");
    threads_ = at::get_num_threads();
    at::set_num_threads(2);
  }
  void TearDown() override {
    unsetenv("CRUCIBLE_KEEP_DENORMALS");
    if (threads_ > 0) at::set_num_threads(threads_);
  }
  int threads_ = 0;
};

TEST_F(Denormals, GuardFlushesCallerAndIntraOpThreadsThenRestores) {
  ASSERT_FALSE(denormals_flushed_on_this_thread());  // the process default
  EXPECT_FALSE(float_product_flushed());
  EXPECT_FALSE(double_product_flushed());
  EXPECT_EQ(flushed_per_thread(), (std::vector<int>{0, 0}));
  {
    const DenormalFlushGuard guard;
    EXPECT_TRUE(denormals_flushed_on_this_thread());
    EXPECT_TRUE(float_product_flushed());
    EXPECT_TRUE(double_product_flushed());
    EXPECT_EQ(flushed_per_thread(), (std::vector<int>{1, 1}));
  }
  EXPECT_FALSE(denormals_flushed_on_this_thread());
  EXPECT_FALSE(float_product_flushed());
  EXPECT_EQ(flushed_per_thread(), (std::vector<int>{0, 0}));
}

TEST_F(Denormals, InnerGuardKeepsTheOuterSetting) {
  {
    const DenormalFlushGuard outer;
    { const DenormalFlushGuard inner; }
    EXPECT_TRUE(denormals_flushed_on_this_thread());
    EXPECT_EQ(flushed_per_thread(), (std::vector<int>{1, 1}));
  }
  EXPECT_FALSE(denormals_flushed_on_this_thread());
}

TEST_F(Denormals, DisabledGuardAndOptOutChangeNothing) {
  {
    const DenormalFlushGuard off(false);
    EXPECT_FALSE(denormals_flushed_on_this_thread());
  }
  setenv("CRUCIBLE_KEEP_DENORMALS", "1", 1);
  {
    const DenormalFlushGuard guard;
    EXPECT_FALSE(denormals_flushed_on_this_thread());
    EXPECT_FALSE(float_product_flushed());
    EXPECT_EQ(flushed_per_thread(), (std::vector<int>{0, 0}));
  }
  setenv("CRUCIBLE_KEEP_DENORMALS", "0", 1);  // "0" does not opt out
  {
    const DenormalFlushGuard guard;
    EXPECT_TRUE(denormals_flushed_on_this_thread());
  }
  EXPECT_FALSE(denormals_flushed_on_this_thread());
}

}  // namespace
}  // namespace crucible
