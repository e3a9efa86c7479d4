// learning_curve.svg: training loss and validation MAEs against the step.

#include "crucible/report/learning_curve.h"

#include "crucible/common/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

namespace crucible {

namespace {

using json = nlohmann::json;

/// A series to plot: (step, value) pairs of one quantity.
struct Series {
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;  // plottable only (finite, > 0)
};

bool plottable(double v) { return std::isfinite(v) && v > 0; }

/// A panel: a rectangle of the picture with a log y-axis.
struct Panel {
  double x0, y0, w, h;  // plot area, px
  std::string y_label;
  std::vector<Series> series;
};

/// 1, 2 or 5 × 10^k, the smallest >= raw (raw > 0).
double nice_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10.0 * mag;
}

/// Linear x-axis shared by the panels: [lo, hi] with ticks every `step`.
struct XAxis {
  double lo = 0, hi = 1, step = 1;
};

XAxis make_x_axis(const std::vector<Panel>& panels) {
  double max_x = 0;
  for (const auto& p : panels) {
    for (const auto& s : p.series) {
      for (const auto& [x, y] : s.points) max_x = std::max(max_x, x);
    }
  }
  XAxis a;
  a.lo = 0;
  const double span = std::max(max_x, 1.0);
  // 1, 2 or 5 × 10^k, at least 1 step, giving at most ~8 intervals.
  const double raw = span / 8.0;
  a.step = std::max(1.0, nice_step(raw));
  a.hi = std::ceil(span / a.step) * a.step;
  return a;
}

/// Log y-axis: log10 range [lo, hi] and ticks (value, labelled).
struct YAxis {
  double lo = 0, hi = 1;
  std::vector<std::pair<double, bool>> ticks;
};

/// Whole decades when the values span at least one (labels at 10^k, and at
/// 2 and 5 × 10^k over at most two decades; minor ticks over at most four);
/// otherwise the padded data range with linear "nice" ticks placed on the
/// log scale, so a narrow range still fills the panel.
YAxis make_y_axis(const Panel& p) {
  double mn = std::numeric_limits<double>::infinity(), mx = 0;
  for (const auto& s : p.series) {
    for (const auto& [x, y] : s.points) {
      mn = std::min(mn, y);
      mx = std::max(mx, y);
    }
  }
  YAxis a;
  if (!(mx > 0)) {
    a.ticks = {{1.0, true}, {10.0, true}};
    return a;
  }
  double l = std::log10(mn), h = std::log10(mx);
  if (h - l < 1e-12) {
    l -= 0.5;
    h += 0.5;
  }
  if (h - l >= 1.0) {
    const int lo = static_cast<int>(std::floor(l)), hi = static_cast<int>(std::ceil(h));
    a.lo = lo;
    a.hi = hi;
    const int decades = hi - lo;
    const int every = std::max(1, (decades + 9) / 10);
    for (int k = lo; k <= hi; ++k) {
      const double d = std::pow(10.0, k);
      a.ticks.emplace_back(d, (k - lo) % every == 0);
      if (k == hi || decades > 4) continue;
      for (int m = 2; m <= 9; ++m) a.ticks.emplace_back(m * d, decades <= 2 && (m == 2 || m == 5));
    }
    return a;
  }
  const double pad = 0.08 * (h - l);
  a.lo = l - pad;
  a.hi = h + pad;
  const double vlo = std::pow(10.0, a.lo), vhi = std::pow(10.0, a.hi);
  const double step = nice_step((vhi - vlo) / 5.0);
  const double first = std::ceil(vlo / step);
  for (int i = 0; i < 50 && (first + i) * step <= vhi; ++i) {
    const double v = (first + i) * step;
    if (v > 0) a.ticks.emplace_back(v, true);
  }
  return a;
}

std::string tick_label(double v) {
  const double k = std::log10(v);
  if (std::abs(k - std::round(k)) < 1e-9 && (k < -3.5 || k > 4.5)) {
    return fmt::format("1e{}", static_cast<int>(std::lround(k)));
  }
  return fmt::format("{:.6g}", v);
}

std::string fmt_value(double v) {
  if (!std::isfinite(v)) return "n/a";
  return fmt::format("{:.4g}", v);
}

void draw_panel(std::string& svg, const Panel& p, const XAxis& xa, bool x_title) {
  const YAxis ya = make_y_axis(p);
  // Data and ticks keep kPad px off the frame, so edge points stay visible.
  constexpr double kPad = 8;
  auto px = [&](double x) {
    return p.x0 + kPad + (x - xa.lo) / (xa.hi - xa.lo) * (p.w - 2 * kPad);
  };
  auto py = [&](double v) {
    return p.y0 + p.h - kPad - (std::log10(v) - ya.lo) / (ya.hi - ya.lo) * (p.h - 2 * kPad);
  };
  const double y1 = p.y0 + p.h;

  svg += "<g class=\"panel\">\n";
  // y ticks: labelled ones with a grid line, the others short.
  for (const auto& [v, labelled] : ya.ticks) {
    const double y = py(v);
    if (labelled) {
      svg += fmt::format(
          "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"#e0e0e0\"/>\n",
          p.x0, y, p.x0 + p.w, y);
      svg += fmt::format(
          "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"black\"/>\n",
          p.x0 - 6, y, p.x0, y);
      svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"end\">{}</text>\n",
                         p.x0 - 9, y + 4, tick_label(v));
    } else {
      svg += fmt::format(
          "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"black\"/>\n",
          p.x0 - 3, y, p.x0, y);
    }
  }
  // x ticks.
  for (double x = xa.lo; x <= xa.hi + 1e-9 * xa.step; x += xa.step) {
    const double X = px(x);
    svg += fmt::format(
        "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"black\"/>\n", X,
        y1, X, y1 + 6);
    svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\">{}</text>\n", X,
                       y1 + 20, static_cast<int64_t>(std::llround(x)));
  }
  // Frame and axis labels.
  svg += fmt::format(
      "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"none\" "
      "stroke=\"black\"/>\n",
      p.x0, p.y0, p.w, p.h);
  const double ly = p.y0 + p.h / 2;
  svg += fmt::format(
      "<text class=\"axis-label\" x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {:.2f} {:.2f})\">{}</text>\n",
      p.x0 - 78, ly, p.x0 - 78, ly, p.y_label);
  if (x_title) {
    svg += fmt::format(
        "<text class=\"axis-label\" x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\">optimizer "
        "step</text>\n",
        p.x0 + p.w / 2, y1 + 42);
  }

  bool any = false;
  for (const auto& s : p.series) {
    if (s.points.empty()) continue;
    any = true;
    std::string pts;
    for (const auto& [x, y] : s.points) {
      pts += fmt::format("{}{:.2f},{:.2f}", pts.empty() ? "" : " ", px(x), py(y));
    }
    svg += fmt::format(
        "<polyline class=\"series\" data-series=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"{}\"/>\n",
        s.label, s.color, pts);
    if (s.points.size() <= 60) {
      for (const auto& [x, y] : s.points) {
        svg += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2.5\" fill=\"{}\"/>\n", px(x),
                           py(y), s.color);
      }
    }
  }
  if (!any) {
    svg += fmt::format(
        "<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" fill=\"#808080\">no data</text>\n",
        p.x0 + p.w / 2, p.y0 + p.h / 2);
  }
  // Legend, right of the panel.
  double y = p.y0 + 14;
  const double lx = p.x0 + p.w + 16;
  for (const auto& s : p.series) {
    if (s.points.empty()) {
      svg += fmt::format(
          "<text class=\"legend\" x=\"{:.2f}\" y=\"{:.2f}\" fill=\"#808080\">{} (no data)</text>\n",
          lx + 28, y + 4, s.label);
    } else {
      svg += fmt::format(
          "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"{}\" "
          "stroke-width=\"2\"/>\n",
          lx, y, lx + 22, y, s.color);
      svg += fmt::format("<text class=\"legend\" x=\"{:.2f}\" y=\"{:.2f}\">{}</text>\n", lx + 28,
                         y + 4, s.label);
    }
    y += 20;
  }
  svg += "</g>\n";
}

}  // namespace

std::string learning_curve_svg(const LearningCurve& curve) {
  const double W = 960, H = 640;
  Panel top{100, 50, 580, 230, "training loss", {}};
  Panel bottom{100, 340, 580, 230, "validation MAE", {}};
  Series loss{"train loss", "#1f77b4", {}};
  for (const auto& p : curve.train) {
    if (plottable(p.loss)) loss.points.emplace_back(static_cast<double>(p.step), p.loss);
  }
  Series energy{"energy MAE (meV/atom)", "#d62728", {}};
  Series forces{"force MAE (meV/Å)", "#2ca02c", {}};
  Series stress{"stress MAE (meV/Å³)", "#9467bd", {}};  // issue 47: trained, so plotted
  for (const auto& p : curve.validation) {
    if (plottable(p.energy_mae)) energy.points.emplace_back(static_cast<double>(p.step), p.energy_mae);
    if (plottable(p.forces_mae)) forces.points.emplace_back(static_cast<double>(p.step), p.forces_mae);
    if (plottable(p.stress_mae)) stress.points.emplace_back(static_cast<double>(p.step), p.stress_mae);
  }
  auto by_step = [](Series& s) {
    std::stable_sort(s.points.begin(), s.points.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  };
  by_step(loss);
  by_step(energy);
  by_step(forces);
  by_step(stress);
  top.series.push_back(std::move(loss));
  bottom.series.push_back(std::move(energy));
  bottom.series.push_back(std::move(forces));
  if (!stress.points.empty()) bottom.series.push_back(std::move(stress));
  const std::vector<Panel> panels = {top, bottom};
  const XAxis xa = make_x_axis(panels);

  std::string subtitle;
  if (!curve.train.empty()) {
    const auto& t = curve.train.back();
    // Issue 47: one batch's loss, not metrics.csv's epoch mean; say which.
    subtitle += fmt::format("loss of the last logged batch {} (step {})", fmt_value(t.loss), t.step);
  }
  if (!curve.validation.empty()) {
    const auto& v = curve.validation.back();
    auto with_unit = [](double x, const char* unit) {
      return std::isfinite(x) ? fmt_value(x) + " " + unit : fmt_value(x);
    };
    subtitle += fmt::format("{}last validation E MAE {}, F MAE {}{} (step {})",
                            subtitle.empty() ? "" : "; ", with_unit(v.energy_mae, "meV/atom"),
                            with_unit(v.forces_mae, "meV/Å"),
                            std::isfinite(v.stress_mae) ? ", S MAE " + with_unit(v.stress_mae, "meV/Å³") : "",
                            v.step);
  }

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H);
  svg += "<title>Crucible learning curve</title>\n";
  svg += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  svg += "<text x=\"100\" y=\"22\" font-size=\"16\">learning curve</text>\n";
  if (!subtitle.empty()) {
    svg += fmt::format("<text x=\"100\" y=\"40\" fill=\"#404040\">{}</text>\n", subtitle);
  }
  draw_panel(svg, panels[0], xa, false);
  draw_panel(svg, panels[1], xa, true);
  svg += "</svg>\n";
  return svg;
}

void write_learning_curve_svg(const std::string& path, const LearningCurve& curve) {
  namespace fs = std::filesystem;
  const std::string svg = learning_curve_svg(curve);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::out | std::ios::trunc | std::ios::binary);
    if (!out) throw DataError(path + ": learning curve file cannot be created");
    out << svg;
    out.flush();
    if (!out) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      throw DataError(path + ": learning curve file cannot be written");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw DataError(path + ": learning curve file cannot be renamed into place: " + ec.message());
  }
}

LearningCurve read_learning_curve_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(path + ": metrics file cannot be opened");
  auto number = [](const json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return std::nan("");
    return it->get<double>();
  };
  LearningCurve curve;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw DataError(where + "line must be a JSON object, got a parse error: " + e.what());
    }
    if (!j.is_object()) {
      throw DataError(where + "line must be a JSON object, got " + std::string(j.type_name()));
    }
    auto step = j.find("step");
    if (step == j.end() || !step->is_number_integer()) {
      throw DataError(where + "\"step\" must be an integer, got " +
                      (step == j.end() ? std::string("none") : step->dump()));
    }
    const std::string type = j.value("type", std::string());
    if (type == "train") {
      curve.train.push_back({step->get<int64_t>(), number(j, "loss")});
    } else if (type == "validation") {
      curve.validation.push_back(
          {step->get<int64_t>(), number(j, "energy_mae"), number(j, "forces_mae"), number(j, "stress_mae")});
    }
  }
  return curve;
}

}  // namespace crucible
