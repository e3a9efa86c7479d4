// Plots a scientist would put in a paper (issue 47): round ticks with
// labels that tell them apart (offset notation for values far from zero),
// MAE and RMSE in every parity panel, a stress panel, config_type colours,
// the thinning rule stated.

#include "crucible/report/parity_plot.h"
#include "crucible/report/plot_axes.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>
#include <set>

namespace crucible {
namespace {

using e2e::count_occurrences;

void expect_good_ticks(double lo, double hi) {
  const AxisTicks t = nice_ticks(lo, hi, 5);
  SCOPED_TRACE(::testing::Message() << "[" << lo << ", " << hi << "] step " << t.step);
  ASSERT_GE(t.values.size(), 3u);
  EXPECT_LE(t.values.size(), 12u);
  EXPECT_LE(t.lo, lo);
  EXPECT_GE(t.hi, hi);
  const double mantissa = t.step / std::pow(10.0, std::floor(std::log10(t.step) + 1e-9));
  EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 2.5) < 1e-9 ||
              std::abs(mantissa - 5) < 1e-9)
      << mantissa;
  std::set<std::string> distinct(t.labels.begin(), t.labels.end());
  EXPECT_EQ(distinct.size(), t.labels.size());
  for (size_t k = 0; k < t.values.size(); ++k) {
    EXPECT_LE(t.labels[k].size(), 8u) << t.labels[k];  // fits left of the axis title
    // The label is the value (minus the offset) to the label's own precision.
    EXPECT_NEAR(std::stod(t.labels[k]) * t.scale + t.offset, t.values[k], 0.51 * t.step) << t.labels[k];
  }
}

TEST(PlotAxes, RoundTicksAndOffsetNotation) {
  // A water set's energies per atom: -156.03 .. -155.98 eV/atom used to read
  // "-156" at every tick.
  const AxisTicks water = nice_ticks(-156.034, -155.981, 5);
  EXPECT_DOUBLE_EQ(water.step, 0.02);
  EXPECT_TRUE(water.offset_text.empty());  // 5 significant digits tell them apart
  EXPECT_EQ(water.labels, (std::vector<std::string>{"-156.04", "-156.02", "-156.00", "-155.98"}));
  // Narrower still: the labels count from a round value.
  const AxisTicks narrow = nice_ticks(-156.0341, -156.0322, 5);
  EXPECT_DOUBLE_EQ(narrow.step, 0.0005);
  EXPECT_EQ(narrow.offset_text, "-156.035");
  EXPECT_EQ(narrow.scale_text, "");
  EXPECT_EQ(narrow.labels.front(), "0.0005");
  // Tiny steps: labels in units of 1e-6 from an offset.
  const AxisTicks tiny = nice_ticks(451.147994, 451.148004, 4);
  EXPECT_EQ(tiny.scale_text, "×1e-06");
  EXPECT_EQ(tiny.offset_text.rfind("451.147", 0), 0u) << tiny.offset_text;
  expect_good_ticks(451.147994, 451.148004);
  const AxisTicks unit = nice_ticks(0.0, 1.0, 5);
  EXPECT_EQ(unit.labels, (std::vector<std::string>{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}));
  EXPECT_TRUE(unit.offset_text.empty());
  const AxisTicks forces = nice_ticks(-3.7, 4.2, 5);
  EXPECT_EQ(forces.labels, (std::vector<std::string>{"-4", "-2", "0", "2", "4", "6"}));
  const AxisTicks quarter = nice_ticks(0.0, 0.1, 4);
  EXPECT_EQ(quarter.labels, (std::vector<std::string>{"0.000", "0.025", "0.050", "0.075", "0.100"}));
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> centre(-2000, 2000), log_width(-5, 3);
  for (int k = 0; k < 300; ++k) {
    const double c = centre(rng), w = std::pow(10.0, log_width(rng));
    expect_good_ticks(c, c + w);
  }
  expect_good_ticks(5.0, 5.0);  // one value
}

TEST(ParityPlot, PanelsFiguresColoursAndTheThinningRule) {
  ParityData d;
  d.title = "schnet model runs/x on valid.xyz (3 structures)";
  std::mt19937_64 rng(1);
  std::normal_distribution<double> noise(0, 0.05);
  const int bulk = d.group_of("bulk"), surface = d.group_of("surface");
  EXPECT_EQ(d.group_of("bulk"), bulk);
  double abs_sum = 0, sq_sum = 0;
  for (int k = 0; k < 12000; ++k) {
    const double r = noise(rng) * 20, e = noise(rng);
    d.forces_ref.push_back(r);
    d.forces_pred.push_back(r + e);
    d.forces_group.push_back(k % 2 ? bulk : surface);
    abs_sum += std::abs(e);
    sq_sum += e * e;
  }
  for (int k = 0; k < 3; ++k) {
    d.energy_ref.push_back(-156.0 + 0.01 * k);
    d.energy_pred.push_back(-156.0 + 0.011 * k);
    d.energy_group.push_back(bulk);
  }
  std::string svg = parity_svg(d);
  EXPECT_NE(svg.find(">schnet model runs/x on valid.xyz (3 structures)</text>"), std::string::npos);
  EXPECT_EQ(count_occurrences(svg, "class=\"point\""), 3u + 4000u);  // 12000 forces, 1 in 3 drawn
  EXPECT_NE(svg.find("1 in 3 drawn (4000 points)"), std::string::npos);
  char mae[64], rmse[64];
  std::snprintf(mae, sizeof mae, "MAE %.3g meV/", 1000 * abs_sum / 12000);
  std::snprintf(rmse, sizeof rmse, "RMSE %.3g meV/", 1000 * std::sqrt(sq_sum / 12000));
  EXPECT_NE(svg.find(mae), std::string::npos) << mae;
  EXPECT_NE(svg.find(rmse), std::string::npos) << rmse;
  EXPECT_NE(svg.find("config_type:"), std::string::npos);  // a legend for two types
  EXPECT_GT(count_occurrences(svg, "#ff7f0e"), 100u);
  EXPECT_EQ(svg.find("stress components"), std::string::npos);  // no stress data, no panel
  EXPECT_NE(svg.find("reference − (-156."), std::string::npos);  // offset notation (energies -156.000..-155.978)
  // A stress panel where stress exists.
  d.stress_ref = {0.01, 0.0, 0.0};
  d.stress_pred = {0.012, 0.001, -0.001};
  d.stress_group = {bulk, bulk, bulk};
  svg = parity_svg(d);
  EXPECT_NE(svg.find("stress components"), std::string::npos);
  EXPECT_EQ(count_occurrences(svg, "class=\"point\""), 3u + 4000u + 3u);
  // One config_type: no legend, one colour.
  ParityData one;
  one.energy_ref = {1, 2};
  one.energy_pred = {1.1, 2.1};
  one.energy_group = {one.group_of("Default"), 0};
  svg = parity_svg(one);
  EXPECT_EQ(svg.find("config_type:"), std::string::npos);
  EXPECT_NE(svg.find("no data"), std::string::npos);  // the forces panel
}

}  // namespace
}  // namespace crucible
