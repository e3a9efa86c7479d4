#pragma once
// Learning-curve picture of a training run (learning_curve.svg): plain SVG
// text, no plotting dependency.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace crucible {

/// The data of a learning curve: what metrics.jsonl logs, by optimizer step.
/// NaN, zero and negative values are allowed; the plot skips them (log axes).
struct LearningCurve {
  /// One logged training step.
  struct TrainPoint {
    int64_t step = 0;   ///< optimizer steps taken (x).
    double loss = 0;    ///< total training loss of the batch at that step.
  };
  /// One validation.
  struct ValidationPoint {
    int64_t step = 0;         ///< optimizer steps taken when it ran (x).
    double energy_mae = 0;    ///< meV/atom (NaN without energy labels).
    double forces_mae = 0;    ///< meV/Å (NaN without force labels).
    double stress_mae = std::numeric_limits<double>::quiet_NaN();  ///< meV/Å³ (NaN without stress labels).
  };
  std::vector<TrainPoint> train;
  std::vector<ValidationPoint> validation;
  /// True if there is any point at all (plottable or not).
  bool empty() const { return train.empty() && validation.empty(); }
};

/// The learning curve as an SVG document (960 × 640 px): the top panel shows
/// the training loss per logged step, the bottom one the validation energy
/// MAE (meV/atom) and force MAE (meV/Å), both with a logarithmic y-axis and
/// a shared linear step axis, with ticks, axis labels and a legend. Each
/// series with at least one plottable (finite, > 0) value is one
/// `<polyline>` (points in step order), plus a circle per point when it has
/// few points (so a single point is visible). A panel without plottable
/// values says "no data". Never throws for any input values.
std::string learning_curve_svg(const LearningCurve& curve);

/// Writes learning_curve_svg(curve) to `path` atomically: to "<path>.tmp",
/// then renamed over `path`.
/// @throws DataError naming the path if the file cannot be written.
void write_learning_curve_svg(const std::string& path, const LearningCurve& curve);

/// Reads a metrics.jsonl written by MetricsJsonlHook back into a curve
/// ("train" lines: step and loss; "validation" lines: step, energy_mae,
/// forces_mae; null values become NaN; other lines are ignored), e.g. to
/// redraw the picture of a finished or crashed run.
/// @throws DataError "<path>:<line>: ..." if the file cannot be read or a
///   line is not a JSON object with an integer "step".
LearningCurve read_learning_curve_jsonl(const std::string& path);

}  // namespace crucible
