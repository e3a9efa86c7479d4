#pragma once
// Loss-weight schedules: the weight w_k(t) of one WeightedSumLoss term as a
// function of the training step or epoch counter.
//
// No state for checkpoints: a schedule is immutable and its weight is a pure
// function of the counters, so resuming only needs the trainer to pass the
// restored step/epoch again through WeightedSumLoss::set_progress.

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

/// Which counter drives a schedule: the optimizer step or the epoch.
enum class ScheduleClock { Step, Epoch };

/// "step" or "epoch".
std::string to_string(ScheduleClock clock);
/// Inverse of to_string. @throws std::invalid_argument on any other text.
ScheduleClock parse_schedule_clock(const std::string& text);

/// A loss weight w(t) >= 0 (dimensionless multiplier of a loss term), where t
/// is the step or the epoch counter (int64, >= 0) according to clock().
/// Implementations are immutable, hence safe to share between copies of a
/// WeightedSumLoss.
class LossWeightSchedule {
 public:
  explicit LossWeightSchedule(ScheduleClock clock = ScheduleClock::Epoch) : clock_(clock) {}
  virtual ~LossWeightSchedule() = default;
  /// Weight at the given counters: value(step) or value(epoch) by clock().
  virtual double weight(int64_t step, int64_t epoch) const {
    return value(clock_ == ScheduleClock::Step ? step : epoch);
  }
  /// Weight at counter value t of this schedule's clock.
  virtual double value(int64_t t) const = 0;
  ScheduleClock clock() const { return clock_; }

 private:
  ScheduleClock clock_;
};

/// w(t) = w for every t.
/// @throws std::invalid_argument if w is negative or not finite.
class ConstantWeight : public LossWeightSchedule {
 public:
  explicit ConstantWeight(double w, ScheduleClock clock = ScheduleClock::Epoch);
  double value(int64_t t) const override;

 private:
  double w_;
};

/// Linear ramp: w(t) = w0 for t <= start, w1 for t >= end, and
/// w0 + (w1 - w0)·(t - start)/(end - start) in between (start == end is a
/// step from w0 to w1 at t = start).
/// @throws std::invalid_argument if w0 or w1 is negative or not finite,
///         start < 0, or end < start.
class LinearWeight : public LossWeightSchedule {
 public:
  LinearWeight(double w0, double w1, int64_t start, int64_t end,
               ScheduleClock clock = ScheduleClock::Epoch);
  double value(int64_t t) const override;

 private:
  double w0_, w1_;
  int64_t start_, end_;
};

/// Cosine ramp (the half-cosine shape of SGDR / torch CosineAnnealingLR):
/// w(t) = w1 + (w0 - w1)·½(1 + cos(π (t - start)/(end - start))) on
/// [start, end]; w0 before start, w1 after end (start == end: a step at t = start).
/// @throws std::invalid_argument as LinearWeight.
class CosineWeight : public LossWeightSchedule {
 public:
  CosineWeight(double w0, double w1, int64_t start, int64_t end,
               ScheduleClock clock = ScheduleClock::Epoch);
  double value(int64_t t) const override;

 private:
  double w0_, w1_;
  int64_t start_, end_;
};

/// Piecewise constant: boundaries b_0 < b_1 < ... < b_{n-1} and values
/// v_0..v_n; w(t) = v_0 for t < b_0, v_i for b_{i-1} <= t < b_i, v_n for
/// t >= b_{n-1} (a boundary is the first counter of its new value, like
/// torch MultiStepLR milestones). No boundaries: the constant v_0.
/// @throws std::invalid_argument if values.size() != boundaries.size() + 1,
///         the boundaries are not strictly increasing, or a value is negative
///         or not finite.
class PiecewiseConstantWeight : public LossWeightSchedule {
 public:
  PiecewiseConstantWeight(std::vector<int64_t> boundaries, std::vector<double> values,
                          ScheduleClock clock = ScheduleClock::Epoch);
  double value(int64_t t) const override;

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
};

}  // namespace crucible
