#pragma once
// Axis ticks for the SVG plots (issue 47): round values, labels with just
// enough digits to tell them apart, offset notation where the values sit
// far from zero compared with their spacing (a water set's -156.02 eV/atom).
// Reference: P. Heckbert, "Nice numbers for graph labels", Graphics Gems
// (1990); matplotlib's ScalarFormatter offset.

#include <string>
#include <vector>

namespace crucible {

/// Ticks of one axis.
struct AxisTicks {
  double lo = 0, hi = 1;            ///< the axis range: the outer ticks (they cover the data).
  std::vector<double> values;       ///< tick positions, ascending, multiples of `step`.
  std::vector<std::string> labels;  ///< the text of each tick (value - offset), all distinct.
  double step = 1;                  ///< 1, 2, 2.5 or 5 × 10^k.
  double offset = 0;                ///< subtracted from every label; 0 = none.
  std::string offset_text;          ///< "" or e.g. "-156.00" (the value the labels add to).
  double scale = 1;                 ///< labels are (value - offset) / scale.
  std::string scale_text;           ///< "" or e.g. "×1e-06" (steps below 1e-4 or above 1e4).
};

/// Round ticks covering [lo, hi] (about `target` of them, at least 2). An
/// empty or non-finite range is widened to ±1 around lo (or to [0, 1]).
/// Labels have max(0, -floor(log10(step))) decimals (+1 for a 2.5 step);
/// steps below 1e-4 or above 1e4 are labelled in units of 10^k (scale,
/// scale_text); when a label would still need more than 5 significant digits
/// the labels show value - offset, offset the lowest tick rounded down to 10
/// steps. Never throws.
AxisTicks nice_ticks(double lo, double hi, int target = 5);

/// `text` with &, <, > escaped for SVG text. Never throws.
std::string svg_escape(const std::string& text);

}  // namespace crucible
