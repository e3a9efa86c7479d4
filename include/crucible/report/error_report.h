#pragma once
// The error figures a scientist reads after `train` and `evaluate` (issue
// 47): every line MAE and RMSE with its count, the two baselines that say
// whether anything was learned, and a config_type table with the same
// columns and flags. One writer for both commands.

#include "crucible/training/metrics.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <ostream>
#include <string>

namespace crucible {

/// "12.34 meV/atom" with `precision` decimals, or "n/a" when `count` is 0
/// or `value` is not finite.
std::string format_metric(double value, int64_t count, const char* unit, int precision = 2);

/// Writes the error lines of `v`, each starting with `indent`:
///   energy  MAE ...  RMSE ...  (n structures)
///   forces  MAE ...  RMSE ...  (n components)
///   stress  MAE ...  RMSE ...  (n components)            (when labelled)
///   baselines: the force MAE of predicting zero forces and the energy RMSE
///   of predicting the mean energy per atom (the labels' standard deviation),
///   each with model/baseline and "WORSE than ..." at a ratio >= 1;
///   config_type table (structures, E MAE, E RMSE, F MAE, F RMSE, flags E!
///   and F! for a type at or above its own baselines) when there are several.
/// Units: meV/atom, meV/Å, meV/Å³ (ErrorMetrics). Never throws beyond the stream's.
void write_error_report(std::ostream& out, const ValidationSummary& v, const std::string& indent);

/// The ValidationSummary a summary.json "validation" object holds (the
/// metrics, counts, baselines and per_config_type written by train; null
/// values read as NaN). Never throws for missing keys (they read as NaN / 0).
ValidationSummary validation_from_json(const nlohmann::json& j);

}  // namespace crucible
