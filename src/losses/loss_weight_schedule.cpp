// Loss-weight schedules (see crucible/losses/loss_weight_schedule.h). The
// cosine shape is the half cosine of SGDR (Loshchilov & Hutter, ICLR 2017),
// as torch.optim.lr_scheduler.CosineAnnealingLR; piecewise-constant
// boundaries behave as torch MultiStepLR milestones.

#include "crucible/losses/loss_weight_schedule.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace crucible {
namespace {

std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

void require_weight(double w, const std::string& what) {
  if (!(w >= 0.0) || !std::isfinite(w)) {
    throw std::invalid_argument(what + " must be a finite number >= 0, got " + num(w));
  }
}

void require_range(int64_t start, int64_t end, const std::string& cls) {
  if (start < 0) {
    throw std::invalid_argument(cls + ": start must be >= 0, got " + std::to_string(start));
  }
  if (end < start) {
    throw std::invalid_argument(cls + ": end must be >= start (" + std::to_string(start) +
                                "), got " + std::to_string(end));
  }
}

}  // namespace

std::string to_string(ScheduleClock clock) {
  return clock == ScheduleClock::Step ? "step" : "epoch";
}

ScheduleClock parse_schedule_clock(const std::string& text) {
  if (text == "step") return ScheduleClock::Step;
  if (text == "epoch") return ScheduleClock::Epoch;
  throw std::invalid_argument("schedule clock must be one of step, epoch, got '" + text + "'");
}

ConstantWeight::ConstantWeight(double w, ScheduleClock clock) : LossWeightSchedule(clock), w_(w) {
  require_weight(w, "ConstantWeight: w");
}

double ConstantWeight::value(int64_t) const { return w_; }

LinearWeight::LinearWeight(double w0, double w1, int64_t start, int64_t end, ScheduleClock clock)
    : LossWeightSchedule(clock), w0_(w0), w1_(w1), start_(start), end_(end) {
  require_weight(w0, "LinearWeight: w0");
  require_weight(w1, "LinearWeight: w1");
  require_range(start, end, "LinearWeight");
}

double LinearWeight::value(int64_t t) const {
  if (t < start_) return w0_;
  if (t >= end_) return w1_;
  const double x = static_cast<double>(t - start_) / static_cast<double>(end_ - start_);
  return w0_ + (w1_ - w0_) * x;
}

CosineWeight::CosineWeight(double w0, double w1, int64_t start, int64_t end, ScheduleClock clock)
    : LossWeightSchedule(clock), w0_(w0), w1_(w1), start_(start), end_(end) {
  require_weight(w0, "CosineWeight: w0");
  require_weight(w1, "CosineWeight: w1");
  require_range(start, end, "CosineWeight");
}

double CosineWeight::value(int64_t t) const {
  if (t < start_) return w0_;
  if (t >= end_) return w1_;
  const double x = static_cast<double>(t - start_) / static_cast<double>(end_ - start_);
  return w1_ + (w0_ - w1_) * 0.5 * (1.0 + std::cos(M_PI * x));
}

PiecewiseConstantWeight::PiecewiseConstantWeight(std::vector<int64_t> boundaries,
                                                 std::vector<double> values, ScheduleClock clock)
    : LossWeightSchedule(clock), boundaries_(std::move(boundaries)), values_(std::move(values)) {
  if (values_.size() != boundaries_.size() + 1) {
    throw std::invalid_argument("PiecewiseConstantWeight: values must have boundaries.size() + 1 = " +
                                std::to_string(boundaries_.size() + 1) + " entries, got " +
                                std::to_string(values_.size()));
  }
  for (size_t i = 1; i < boundaries_.size(); ++i) {
    if (!(boundaries_[i] > boundaries_[i - 1])) {
      throw std::invalid_argument("PiecewiseConstantWeight: boundaries must be strictly increasing, got " +
                                  std::to_string(boundaries_[i]) + " after " +
                                  std::to_string(boundaries_[i - 1]) + " at index " + std::to_string(i));
    }
  }
  for (size_t i = 0; i < values_.size(); ++i) {
    require_weight(values_[i], "PiecewiseConstantWeight: values[" + std::to_string(i) + "]");
  }
}

double PiecewiseConstantWeight::value(int64_t t) const {
  size_t i = 0;
  while (i < boundaries_.size() && t >= boundaries_[i]) ++i;
  return values_[i];
}

}  // namespace crucible
