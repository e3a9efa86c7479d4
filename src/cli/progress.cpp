// Per-epoch progress line and metrics.csv hooks.

#include "crucible/cli/progress.h"

#include "crucible/common/error.h"
#include "crucible/data/batch.h"
#include "crucible/losses/loss.h"
#include "crucible/training/strategy.h"

#include <fmt/format.h>

#include <cmath>

namespace crucible {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

const std::vector<std::string>& validation_metric_names() {
  static const std::vector<std::string> names = {
      "energy_mae", "energy_rmse", "forces_mae",      "forces_rmse",
      "stress_mae", "stress_rmse", "zero_forces_mae"};
  return names;
}

bool EpochReportHook::runs_on_stage(TrainingStage stage) const {
  return stage == TrainingStage::BEFORE_EPOCH || stage == TrainingStage::AFTER_BATCH ||
         stage == TrainingStage::AFTER_EPOCH || stage == TrainingStage::AFTER_VALIDATION;
}

void EpochReportHook::enter() {
  start_ = epoch_start_ = std::chrono::steady_clock::now();
  current_ = EpochRecord{};
  epoch_open_ = pending_ = false;
  last_emitted_step_ = -1;
  last_emitted_validated_ = false;
  records_.clear();
}

void EpochReportHook::operator()(TrainContext& ctx, TrainingStage stage) {
  switch (stage) {
    case TrainingStage::BEFORE_EPOCH:
      current_ = EpochRecord{};
      epoch_open_ = true;
      pending_ = false;
      epoch_start_ = std::chrono::steady_clock::now();
      break;
    case TrainingStage::AFTER_BATCH: {
      if (!epoch_open_) {  // restarted mid-epoch: no BEFORE_EPOCH
        epoch_open_ = true;
        epoch_start_ = std::chrono::steady_clock::now();
      }
      const double n = static_cast<double>(current_.batches);
      auto running_mean = [n](double mean, double x) { return (mean * n + x) / (n + 1.0); };
      if (ctx.loss.defined()) {
        current_.train_loss = running_mean(current_.train_loss, ctx.loss.item<double>());
      }
      if (ctx.losses) {
        for (const auto& [k, v] : ctx.losses->components) {
          current_.train_components[k] = running_mean(current_.train_components[k], v.item<double>());
        }
      }
      if (ctx.batch) current_.structures += ctx.batch->num_graphs();
      ++current_.batches;
      current_.step = ctx.step_count;
      break;
    }
    case TrainingStage::AFTER_EPOCH:
      current_.epoch = ctx.epoch_count;
      current_.step = ctx.step_count;
      current_.epoch_seconds = seconds_since(epoch_start_);
      current_.elapsed_seconds = seconds_since(start_);
      epoch_open_ = false;
      if (ctx.strategy && ctx.strategy->validation_due_after_epoch()) {
        pending_ = true;
      } else {
        emit(current_);
      }
      break;
    case TrainingStage::AFTER_VALIDATION: {
      if (ctx.validation) last_validation_ = *ctx.validation;
      if (pending_) {
        pending_ = false;
        EpochRecord r = current_;
        r.validation = last_validation_;
        r.elapsed_seconds = seconds_since(start_);
        emit(std::move(r));
        break;
      }
      // The validation after training (or a step-based one).
      if (ctx.step_count == last_emitted_step_ && last_emitted_validated_) break;
      EpochRecord r;
      if (epoch_open_ && current_.batches > 0) {
        r = current_;  // partial epoch
        r.epoch = ctx.epoch_count + 1;
        r.epoch_seconds = seconds_since(epoch_start_);
      } else if (!records_.empty()) {
        r = records_.back();
      }
      r.step = ctx.step_count;
      r.validation = last_validation_;
      r.elapsed_seconds = seconds_since(start_);
      r.final = true;
      emit(std::move(r));
      break;
    }
    default:
      break;
  }
}

void EpochReportHook::emit(EpochRecord record) {
  last_emitted_step_ = record.step;
  last_emitted_validated_ = record.validation.has_value();
  records_.push_back(record);
  report(records_.back());
}

// ------------------------------------------------------------- progress ----

ProgressHook::ProgressHook(std::ostream& out, int64_t total_epochs)
    : out_(out), total_epochs_(total_epochs) {}

void ProgressHook::report(const EpochRecord& r) {
  std::string line;
  if (r.final && r.epoch == 0) {
    line = "final       ";
  } else if (total_epochs_ > 0) {
    const int width = static_cast<int>(std::to_string(total_epochs_).size());
    line = fmt::format("epoch {:>{}}/{}", r.epoch, width, total_epochs_);
  } else {
    line = fmt::format("epoch {:>4}", r.epoch);
  }
  line += fmt::format("  step {:>6}  loss {:.4e}", r.step, r.train_loss);
  if (r.validation) {
    const auto& v = *r.validation;
    if (v.num_energies > 0) line += fmt::format("  E MAE {:8.2f} meV/atom", v.energy_mae);
    if (v.num_forces > 0) line += fmt::format("  F MAE {:8.2f} meV/Å", v.forces_mae);
    if (v.num_stresses > 0) line += fmt::format("  S MAE {:7.3f} meV/Å³", v.stress_mae);
  }
  if (r.epoch_seconds > 0 && r.structures > 0) {
    line += fmt::format("  {:7.1f} struct/s", static_cast<double>(r.structures) / r.epoch_seconds);
  }
  line += fmt::format("  elapsed {:.1f} s", r.elapsed_seconds);
  if (r.final) line += "  (final)";
  out_ << line << "\n";
  out_.flush();
}

// ------------------------------------------------------------------ csv ----

MetricsCsvHook::MetricsCsvHook(std::string path, std::vector<std::string> loss_terms)
    : path_(std::move(path)), loss_terms_(std::move(loss_terms)) {}

void MetricsCsvHook::enter() {
  EpochReportHook::enter();
  file_.close();
  file_.open(path_, std::ios::out | std::ios::trunc);
  if (!file_) throw DataError(path_ + ": metrics file cannot be created");
  file_ << "epoch,step,elapsed_s,train_loss";
  for (const auto& t : loss_terms_) file_ << ",train_loss_" << t;
  for (const auto& m : validation_metric_names()) file_ << ",valid_" << m;
  file_ << "\n";
  file_.flush();
}

void MetricsCsvHook::exit(bool failed) {
  (void)failed;
  file_.flush();
  file_.close();
}

void MetricsCsvHook::report(const EpochRecord& r) {
  if (!file_.is_open()) return;
  auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.10g}", v) : std::string(); };
  file_ << r.epoch << "," << r.step << "," << fmt::format("{:.3f}", r.elapsed_seconds) << ","
        << num(r.train_loss);
  for (const auto& t : loss_terms_) {
    auto it = r.train_components.find(t);
    file_ << "," << (it == r.train_components.end() ? std::string() : num(it->second));
  }
  const auto metrics = r.validation ? r.validation->as_map() : std::map<std::string, double>{};
  for (const auto& m : validation_metric_names()) {
    auto it = metrics.find(m);
    file_ << "," << (it == metrics.end() ? std::string() : num(it->second));
  }
  file_ << "\n";
  file_.flush();
}

}  // namespace crucible
