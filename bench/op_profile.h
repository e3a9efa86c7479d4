#pragma once
// Time per LibTorch op and input shapes, from LibTorch's legacy profiler:
// where a training step's time goes, op by op (bench/README: --profile).

#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace crucible::bench {

/// Starts recording every op with its input shapes on all threads.
inline void start_op_profile() {
  using namespace torch::autograd::profiler;
  enableProfilerLegacy(ProfilerConfig(ProfilerState::CPU, /*report_input_shapes=*/true, /*profile_memory=*/false));
}

/// Stops recording and prints the `top` (op, input shapes) pairs by total
/// inclusive time (µs; an op's time includes the ops it calls, so a
/// composite such as aten::linear also counts its aten::mm).
inline void stop_op_profile(std::FILE* out, size_t top) {
  using namespace torch::autograd::profiler;
  const thread_event_lists lists = disableProfilerLegacy();
  std::map<std::string, std::pair<double, int>> total;
  for (const auto& events : lists) {
    std::vector<const LegacyEvent*> open;
    for (const LegacyEvent& e : events) {
      if (e.kindStr() == "push") {
        open.push_back(&e);
      } else if (e.kindStr() == "pop" && !open.empty()) {
        const LegacyEvent* begin = open.back();
        open.pop_back();
        std::string key = begin->name();
        for (const auto& shape : begin->shapes()) {
          key += " [";
          for (size_t k = 0; k < shape.size(); ++k) key += (k ? "," : "") + std::to_string(shape[k]);
          key += "]";
        }
        auto& t = total[key];
        t.first += begin->cpuElapsedUs(e);
        t.second += 1;
      }
    }
  }
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [key, t] : total) rows.emplace_back(t.first, key + "  n=" + std::to_string(t.second));
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(out, "op profile: total µs, op [input shapes], calls\n");
  for (size_t k = 0; k < rows.size() && k < top; ++k) std::fprintf(out, "%12.0f  %s\n", rows[k].first, rows[k].second.c_str());
}

}  // namespace crucible::bench
