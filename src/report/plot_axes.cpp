// See include/crucible/report/plot_axes.h.

#include "crucible/report/plot_axes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace crucible {

namespace {

/// The round step (1, 2, 2.5, 5 × 10^k) nearest above `raw`.
double nice_step(double raw) {
  const double exponent = std::floor(std::log10(raw));
  const double base = std::pow(10.0, exponent);
  const double f = raw / base;
  const double nice = f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 2.5 ? 2.5 : f <= 5.0 ? 5.0 : 10.0;
  return nice * base;
}

std::string label(double v, int decimals) {
  if (std::abs(v) < 1e-12) v = 0.0;  // no "-0.00"
  return fmt::format("{:.{}f}", v, decimals);
}

}  // namespace

AxisTicks nice_ticks(double lo, double hi, int target) {
  AxisTicks t;
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  if (!(hi > lo)) {
    const double w = std::max(1e-12, std::abs(lo) * 1e-3);
    lo -= w;
    hi += w;
    if (!(hi > lo)) lo -= 1, hi += 1;
  }
  target = std::max(2, target);
  t.step = nice_step((hi - lo) / target);
  const double first = std::floor(lo / t.step + 1e-9) * t.step;
  const double last = std::ceil(hi / t.step - 1e-9) * t.step;
  const int n = static_cast<int>(std::llround((last - first) / t.step));
  for (int k = 0; k <= n; ++k) t.values.push_back(first + k * t.step);
  t.lo = t.values.front();
  t.hi = t.values.back();
  const int exponent = static_cast<int>(std::floor(std::log10(t.step) + 1e-9));
  const bool quarter = std::abs(t.step / std::pow(10.0, exponent) - 2.5) < 1e-6;
  // Very small or large steps: labels in units of 10^exponent (×1e-06).
  if (exponent < -4 || exponent > 4) {
    t.scale = std::pow(10.0, exponent);
    t.scale_text = fmt::format("×1e{:+03d}", exponent);
  }
  const int decimals = (t.scale == 1.0 ? std::max(0, -exponent) : 0) + (quarter ? 1 : 0);
  const double largest = std::max(std::abs(t.lo), std::abs(t.hi)) / t.scale;
  const int integer_digits = largest >= 1 ? static_cast<int>(std::floor(std::log10(largest))) + 1 : 1;
  if (integer_digits + decimals > 5) {  // offset notation: labels count from a round value
    const double unit = 10.0 * t.step;
    t.offset = std::floor(t.lo / unit + 1e-9) * unit;
    t.offset_text = label(t.offset, std::max(0, -(exponent + 1)));
  }
  for (double v : t.values) t.labels.push_back(label((v - t.offset) / t.scale, decimals));
  return t;
}

std::string svg_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

}  // namespace crucible
