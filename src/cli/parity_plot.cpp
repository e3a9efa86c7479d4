// Parity plots (see include/crucible/cli/parity_plot.h).

#include "crucible/cli/parity_plot.h"

#include "crucible/common/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace crucible {
namespace {

/// One panel at x offset `ox`: 400 × 400 px plot area.
std::string panel(double ox, const std::vector<double>& ref, const std::vector<double>& pred, size_t max_points,
                  const std::string& title, const std::string& unit, double mae_factor, const std::string& mae_unit) {
  const double x0 = ox + 70, y0 = 40, size = 400;
  std::string out = fmt::format("<text x=\"{}\" y=\"24\" font-size=\"16\">{}</text>\n", x0, title);
  std::vector<std::pair<double, double>> pts;
  for (size_t k = 0; k < std::min(ref.size(), pred.size()); ++k) {
    if (std::isfinite(ref[k]) && std::isfinite(pred[k])) pts.emplace_back(ref[k], pred[k]);
  }
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", x0, y0,
                     size, size);
  if (pts.empty()) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\">no data</text>\n", x0 + 170, y0 + 200);
    return out;
  }
  double lo = pts[0].first, hi = pts[0].first, mae = 0;
  for (const auto& [r, p] : pts) {
    lo = std::min({lo, r, p});
    hi = std::max({hi, r, p});
    mae += std::abs(p - r);
  }
  mae /= static_cast<double>(pts.size());
  if (!(hi > lo)) {
    lo -= 1;
    hi += 1;
  }
  const double pad = 0.04 * (hi - lo);
  lo -= pad;
  hi += pad;
  auto X = [&](double v) { return x0 + size * (v - lo) / (hi - lo); };
  auto Y = [&](double v) { return y0 + size - size * (v - lo) / (hi - lo); };
  out += fmt::format("<line class=\"diagonal\" x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"gray\"/>\n",
                     X(lo), Y(lo), X(hi), Y(hi));
  const size_t stride = pts.size() > max_points ? (pts.size() + max_points - 1) / max_points : 1;
  for (size_t k = 0; k < pts.size(); k += stride) {
    out += fmt::format("<circle class=\"point\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2\" fill=\"#1f77b4\" fill-opacity=\"0.6\"/>\n",
                       X(pts[k].first), Y(pts[k].second));
  }
  for (int t = 0; t <= 4; ++t) {
    const double v = lo + (hi - lo) * t / 4.0;
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{:.4g}</text>\n", X(v),
                       y0 + size + 16, v);
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{:.4g}</text>\n", x0 - 6,
                       Y(v) + 4, v);
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\">reference ({})</text>\n",
                     x0 + size / 2, y0 + size + 36, unit);
  out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 {} {})\">"
                     "predicted ({})</text>\n",
                     x0 - 52, y0 + size / 2, x0 - 52, y0 + size / 2, unit);
  out += fmt::format("<text class=\"mae\" x=\"{}\" y=\"{}\" font-size=\"13\">MAE {:.2f} {} ({} values)</text>\n", x0 + 8,
                     y0 + 18, mae * mae_factor, mae_unit, pts.size());
  return out;
}

}  // namespace

std::string parity_svg(const ParityData& d) {
  std::string out =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"500\" viewBox=\"0 0 1000 500\" "
      "font-family=\"sans-serif\">\n<rect width=\"1000\" height=\"500\" fill=\"white\"/>\n";
  out += panel(0, d.energy_ref, d.energy_pred, 20000, "energy per atom", "eV/atom", 1000.0, "meV/atom");
  out += panel(500, d.forces_ref, d.forces_pred, 20000, "force components", "eV/\xC3\x85", 1000.0, "meV/\xC3\x85");
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
