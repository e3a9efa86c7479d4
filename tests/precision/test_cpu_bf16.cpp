// Issue 19: the start-up note of bf16 modes on CPUs that emulate bf16.

#include "crucible/precision/cpu_bf16.h"

#include <gtest/gtest.h>

#include <iostream>

namespace crucible {
namespace {

TEST(CpuBf16, NativeFlagsAreAvx512Bf16OrAmx) {
  EXPECT_TRUE(cpu_flags_have_native_bf16(" fpu sse2 avx2 avx512f avx512_bf16 amx_tile"));
  EXPECT_TRUE(cpu_flags_have_native_bf16("avx2 amx_bf16"));
  // Zen 3: AVX2 only; a flag that merely contains the text does not count.
  EXPECT_FALSE(cpu_flags_have_native_bf16(" fpu avx2 fma bmi2 avx512_bf16x"));
  EXPECT_FALSE(cpu_flags_have_native_bf16(""));
}

TEST(CpuBf16, NoteSaysHowMuchSlowerAndNothingOnNativeCpus) {
  EXPECT_EQ(cpu_bf16_note("avx512f avx512_bf16", 1.0, 30.0), "");
  EXPECT_EQ(cpu_bf16_note("avx2", 0.001, 0.0278),
            "this CPU has no native bf16 (avx512_bf16 / amx_bf16 missing from /proc/cpuinfo): a bf16 matrix "
            "product measured 27.8x slower than fp32 here; 32-true is likely faster");
  EXPECT_NE(cpu_bf16_note("avx2", 0.002, 0.001).find("2.0x faster"), std::string::npos);
}

TEST(CpuBf16, MeasuresBothProductsOnThisMachine) {
  const auto [fp32, bf16] = measure_cpu_matmul_fp32_bf16();
  EXPECT_GT(fp32, 0.0);
  EXPECT_GT(bf16, 0.0);
  EXPECT_LT(fp32, 5.0);
  // This machine's flags, for the log.
  std::cout << "fp32 " << fp32 * 1e3 << " ms, bf16 " << bf16 * 1e3 << " ms per 256^3 product; native bf16: "
            << cpu_flags_have_native_bf16(read_cpu_flags()) << "\n";
}

}  // namespace
}  // namespace crucible
