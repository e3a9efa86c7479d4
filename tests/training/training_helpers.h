#pragma once
// Helpers the training suites share (one definition, so that the suite also
// compiles as unity batches: tests/CMakeLists.txt).

#include "crucible/losses/loss.h"
#include "crucible/training/strategy.h"
#include "toy_model.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace crucible::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

/// `steps` optimizer steps at learning rate 0.01, model and batches in
/// `dtype` (float64 unless told), no precision mode.
inline StrategyOptions steps_options(int64_t steps, at::ScalarType dtype = at::kDouble) {
  StrategyOptions o;
  o.num_steps = steps;
  o.dtype = dtype;
  o.optimizer.lr = 0.01;
  return o;
}

/// `steps` optimizer steps at learning rate 0.01 under the precision mode
/// `precision` (parse_precision; "" = none, StrategyOptions' default dtype).
inline StrategyOptions precision_options(int64_t steps, const std::string& precision = "") {
  StrategyOptions o;
  o.num_steps = steps;
  o.optimizer.lr = 0.01;
  o.precision = precision;
  return o;
}

/// The energy MSE alone, weight 1.
inline WeightedSumLoss energy_loss() {
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  return loss;
}

/// The toy model's parameters {a, b, c}.
inline std::vector<double> params(const ToyModel& m) {
  return {m->a.item<double>(), m->b.item<double>(), m->c.item<double>()};
}

}  // namespace crucible::testing
