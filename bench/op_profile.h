#pragma once
// Time per LibTorch op and input shapes, from LibTorch's legacy profiler:
// where a training step's time goes, op by op (bench/README: --profile).

#include <ATen/record_function.h>
#include <c10/util/Backtrace.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace crucible::bench {

/// With CRUCIBLE_TRACE_MIXED set: every op (casts aside) whose floating
/// inputs of more than 10000 elements mix dtypes, on stderr with a backtrace,
/// at its 1st, 100th, 200th ... call. A bf16 × float32 product is 20-40× slower
/// than either dtype alone in LibTorch 1.13 (docs/training_speed.md), so a
/// bf16-mixed step should show none but autocast's own (aten::linear).
inline void trace_mixed_dtype_ops() {
  at::addGlobalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        c10::optional<at::ScalarType> first;
        bool mixed = false;
        int64_t numel = 0;
        for (const c10::IValue& v : fn.inputs()) {
          if (!v.isTensor() || !v.toTensor().defined()) continue;
          const at::Tensor& t = v.toTensor();
          if (!at::isFloatingType(t.scalar_type()) || t.dim() == 0) continue;
          numel = std::max<int64_t>(numel, t.numel());
          if (!first) first = t.scalar_type();
          else if (*first != t.scalar_type()) mixed = true;
        }
        const std::string name = fn.name();
        const bool cast = name.find("copy") != std::string::npos || name.find("aten::to") != std::string::npos;
        if (!mixed || numel <= 10000 || cast) return nullptr;
        static std::mutex m;
        static std::map<std::string, int> seen;
        std::lock_guard<std::mutex> lock(m);
        const int n = ++seen[name];
        if (n == 1 || n % 100 == 0) {
          std::fprintf(stderr, "mixed dtypes: %s numel=%lld call %d\n%s\n", name.c_str(),
                       static_cast<long long>(numel), n, c10::get_backtrace(0, 40).c_str());
        }
        return nullptr;
      }).needsInputs(true));
}

/// Starts recording every op with its input shapes on all threads (and the
/// mixed-dtype trace above when CRUCIBLE_TRACE_MIXED is set).
inline void start_op_profile() {
  using namespace torch::autograd::profiler;
  if (std::getenv("CRUCIBLE_TRACE_MIXED")) trace_mixed_dtype_ops();
  enableProfilerLegacy(ProfilerConfig(ProfilerState::CPU, /*report_input_shapes=*/true, /*profile_memory=*/false));
}

/// Stops recording and prints the `top` (op, input shapes) pairs by total
/// inclusive time (µs; an op's time includes the ops it calls, so a
/// composite such as aten::linear also counts its aten::mm), with the self
/// time (the ops it calls subtracted) next to it. With CRUCIBLE_PROFILE_SELF
/// set the rows are sorted by self time instead.
inline void stop_op_profile(std::FILE* out, size_t top) {
  using namespace torch::autograd::profiler;
  const thread_event_lists lists = disableProfilerLegacy();
  struct Total {
    double inclusive = 0, self = 0;
    int calls = 0;
  };
  std::map<std::string, Total> total;
  for (const auto& events : lists) {
    std::vector<std::pair<const LegacyEvent*, double>> open;  // event, time of the ops it called
    for (const LegacyEvent& e : events) {
      if (e.kindStr() == "push") {
        open.emplace_back(&e, 0.0);
      } else if (e.kindStr() == "pop" && !open.empty()) {
        const auto [begin, children] = open.back();
        open.pop_back();
        std::string key = begin->name();
        for (const auto& shape : begin->shapes()) {
          key += " [";
          for (size_t k = 0; k < shape.size(); ++k) key += (k ? "," : "") + std::to_string(shape[k]);
          key += "]";
        }
        const double us = begin->cpuElapsedUs(e);
        if (!open.empty()) open.back().second += us;
        auto& t = total[key];
        t.inclusive += us;
        t.self += us - children;
        t.calls += 1;
      }
    }
  }
  const bool by_self = std::getenv("CRUCIBLE_PROFILE_SELF") != nullptr;
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [key, t] : total) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%12.0f %12.0f  ", t.inclusive, t.self);
    rows.emplace_back(by_self ? t.self : t.inclusive, buf + key + "  n=" + std::to_string(t.calls));
  }
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(out, "op profile: total µs, self µs, op [input shapes], calls\n");
  for (size_t k = 0; k < rows.size() && k < top; ++k) std::fprintf(out, "%s\n", rows[k].second.c_str());
}

}  // namespace crucible::bench
