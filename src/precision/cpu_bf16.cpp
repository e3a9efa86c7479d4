// Native bf16 on the CPU (issue 19). See include/crucible/precision/cpu_bf16.h.

#include "crucible/precision/cpu_bf16.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

namespace crucible {

bool cpu_flags_have_native_bf16(const std::string& flags) {
  std::istringstream in(flags);
  for (std::string f; in >> f;) {
    if (f == "avx512_bf16" || f == "amx_bf16") return true;
  }
  return false;
}

std::string read_cpu_flags() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("flags", 0) == 0) return line.substr(line.find(':') == std::string::npos ? 0 : line.find(':') + 1);
  }
  return "";
}

std::pair<double, double> measure_cpu_matmul_fp32_bf16() {
  auto best = [](at::ScalarType type) {
    const at::Tensor a = at::randn({256, 256}).to(type), b = at::randn({256, 256}).to(type);
    (void)at::matmul(a, b);  // warm-up
    double seconds = 1e30;
    for (int k = 0; k < 3; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      const at::Tensor c = at::matmul(a, b);
      (void)c.sum().item<float>();
      seconds = std::min(seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return seconds;
  };
  return {best(at::kFloat), best(at::kBFloat16)};
}

std::string cpu_bf16_note(const std::string& flags, double fp32_seconds, double bf16_seconds) {
  if (cpu_flags_have_native_bf16(flags)) return "";
  const double ratio = fp32_seconds > 0 ? bf16_seconds / fp32_seconds : 0.0;
  return fmt::format("this CPU has no native bf16 (avx512_bf16 / amx_bf16 missing from /proc/cpuinfo): a bf16 "
                     "matrix product measured {:.1f}x {} than fp32 here; 32-true is likely faster",
                     ratio >= 1 ? ratio : (ratio > 0 ? 1.0 / ratio : 0.0), ratio >= 1 ? "slower" : "faster");
}

}  // namespace crucible
