// Parity plots (see include/crucible/report/parity_plot.h).

#include "crucible/report/parity_plot.h"

#include "crucible/report/plot_axes.h"
#include "crucible/common/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace crucible {
namespace {

// matplotlib's tab10, for config_types in order of first appearance.
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

const char* color_of(int group, size_t groups) {
  if (groups <= 1) return kColors[0];
  return group >= 0 && group < 10 ? kColors[group] : "#000000";
}

struct Series {
  const std::vector<double>& ref;
  const std::vector<double>& pred;
  const std::vector<int>& group;
};

constexpr double kPanelWidth = 470, kPlotSize = 360, kPlotTop = 92;

/// One panel at x offset `ox`.
std::string panel(double ox, const Series& s, size_t groups, const std::string& title, const std::string& unit,
                  const std::string& error_unit) {
  const double x0 = ox + 90, y0 = kPlotTop, size = kPlotSize;
  std::string out = fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", x0,
                                y0 - 10, title);
  struct Point {
    double r, p;
    int g;
  };
  std::vector<Point> pts;
  for (size_t k = 0; k < std::min(s.ref.size(), s.pred.size()); ++k) {
    if (std::isfinite(s.ref[k]) && std::isfinite(s.pred[k])) {
      pts.push_back({s.ref[k], s.pred[k], k < s.group.size() ? s.group[k] : 0});
    }
  }
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", x0, y0,
                     size, size);
  if (pts.empty()) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\" text-anchor=\"middle\">no data</text>\n",
                       x0 + size / 2, y0 + size / 2);
    return out;
  }
  double lo = pts[0].r, hi = pts[0].r, abs_sum = 0, sq_sum = 0;
  for (const auto& q : pts) {
    lo = std::min({lo, q.r, q.p});
    hi = std::max({hi, q.r, q.p});
    abs_sum += std::abs(q.p - q.r);
    sq_sum += (q.p - q.r) * (q.p - q.r);
  }
  const double n = static_cast<double>(pts.size());
  const double mae = abs_sum / n, rmse = std::sqrt(sq_sum / n);
  const AxisTicks ticks = nice_ticks(lo, hi, 5);
  lo = ticks.lo;
  hi = ticks.hi;
  auto X = [&](double v) { return x0 + size * (v - lo) / (hi - lo); };
  auto Y = [&](double v) { return y0 + size - size * (v - lo) / (hi - lo); };
  for (size_t k = 0; k < ticks.values.size(); ++k) {  // grid, ticks and labels
    const double v = ticks.values[k];
    out += fmt::format("<line x1=\"{0:.2f}\" y1=\"{1}\" x2=\"{0:.2f}\" y2=\"{2}\" stroke=\"#e6e6e6\"/>\n", X(v), y0,
                       y0 + size);
    out += fmt::format("<line x1=\"{1}\" y1=\"{0:.2f}\" x2=\"{2}\" y2=\"{0:.2f}\" stroke=\"#e6e6e6\"/>\n", Y(v), x0,
                       x0 + size);
    out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
                       X(v), y0 + size + 15, ticks.labels[k]);
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
                       x0 - 5, Y(v) + 4, ticks.labels[k]);
  }
  const std::string shifted = ticks.offset_text.empty() ? "" : " − (" + ticks.offset_text + ")";
  const std::string units = ticks.scale_text.empty() ? unit : ticks.scale_text + " " + unit;
  out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\">reference{} ({})</text>\n",
                     x0 + size / 2, y0 + size + 34, shifted, units);
  out += fmt::format("<text x=\"{0}\" y=\"{1}\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 {0} {1})\">"
                     "predicted{2} ({3})</text>\n",
                     x0 - 66, y0 + size / 2, shifted, units);
  out += fmt::format("<line class=\"diagonal\" x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"gray\"/>\n",
                     X(lo), Y(lo), X(hi), Y(hi));
  const size_t stride = pts.size() > kParityMaxPoints ? (pts.size() + kParityMaxPoints - 1) / kParityMaxPoints : 1;
  for (size_t k = 0; k < pts.size(); k += stride) {
    out += fmt::format("<circle class=\"point\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2\" fill=\"{}\" fill-opacity=\"0.6\"/>\n",
                       X(pts[k].r), Y(pts[k].p), color_of(pts[k].g, groups));
  }
  // The figures, on a white box so points do not hide them.
  std::vector<std::string> lines{fmt::format("MAE {:.3g} {}", mae * 1000.0, error_unit),
                                 fmt::format("RMSE {:.3g} {}", rmse * 1000.0, error_unit),
                                 fmt::format("{} values", pts.size())};
  if (stride > 1) lines.push_back(fmt::format("1 in {} drawn ({} points)", stride, (pts.size() + stride - 1) / stride));
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"170\" height=\"{}\" fill=\"white\" fill-opacity=\"0.85\" "
                     "stroke=\"#cccccc\"/>\n",
                     x0 + 6, y0 + 6, 8 + 16 * lines.size());
  for (size_t k = 0; k < lines.size(); ++k) {
    out += fmt::format("<text class=\"stat\" x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n", x0 + 12,
                       y0 + 22 + 16 * k, lines[k]);
  }
  return out;
}

}  // namespace

int ParityData::group_of(const std::string& config_type) {
  const auto it = std::find(groups.begin(), groups.end(), config_type);
  if (it != groups.end()) return static_cast<int>(it - groups.begin());
  groups.push_back(config_type);
  return static_cast<int>(groups.size()) - 1;
}

std::string parity_svg(const ParityData& d) {
  const bool stress = !d.stress_ref.empty();
  const int panels = stress ? 3 : 2;
  const double width = 20 + panels * kPanelWidth, height = kPlotTop + kPlotSize + 50;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      width, height);
  out += fmt::format("<text class=\"title\" x=\"{}\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">{}</text>\n",
                     width / 2, svg_escape(d.title.empty() ? std::string("parity plot") : d.title));
  if (d.groups.size() > 1) {  // legend: config_types and their colours
    double x = 110;
    out += "<text x=\"20\" y=\"50\" font-size=\"12\">config_type:</text>\n";
    for (size_t g = 0; g < d.groups.size() && g < 11; ++g) {
      const std::string name = g == 10 ? "others" : d.groups[g];
      out += fmt::format("<circle cx=\"{}\" cy=\"46\" r=\"4\" fill=\"{}\"/><text x=\"{}\" y=\"50\" font-size=\"12\">{}</text>\n",
                         x, color_of(static_cast<int>(g), d.groups.size()), x + 8, svg_escape(name));
      x += 22 + 7.0 * static_cast<double>(name.size());
    }
  }
  const size_t groups = d.groups.size();
  out += panel(0, {d.energy_ref, d.energy_pred, d.energy_group}, groups, "energy per atom", "eV/atom", "meV/atom");
  out += panel(kPanelWidth, {d.forces_ref, d.forces_pred, d.forces_group}, groups, "force components",
               "eV/\xC3\x85", "meV/\xC3\x85");
  if (stress) {
    out += panel(2 * kPanelWidth, {d.stress_ref, d.stress_pred, d.stress_group}, groups, "stress components",
                 "eV/\xC3\x85\xC2\xB3", "meV/\xC3\x85\xC2\xB3");
  }
  out += "</svg>\n";
  return out;
}

void write_parity_svg(const std::string& path, const ParityData& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw DataError(path + ": --parity file cannot be created");
    f << parity_svg(data);
    f.flush();
    if (!f) throw DataError(path + ": --parity file cannot be written");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw DataError(path + ": --parity file cannot be written (" + ec.message() + ")");
}

}  // namespace crucible
