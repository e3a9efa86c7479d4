// Live progress bar, per-epoch progress line and metrics.csv hooks.

#include "crucible/report/progress.h"
#include "crucible/report/metrics_log.h"

#include <filesystem>

#include "crucible/common/error.h"
#include "crucible/data/batch.h"
#include "crucible/losses/loss.h"
#include "crucible/training/strategy.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <cstring>
#include <cerrno>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace crucible {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// An EpochRecord without its validation (a resumed run validates anew).
// Doubles go through JSON exactly (nlohmann writes the shortest round trip).
nlohmann::json record_to_json(const EpochRecord& r) {
  return {{"epoch", r.epoch},           {"step", r.step},
          {"batches", r.batches},       {"structures", r.structures},
          {"train_loss", r.train_loss}, {"train_components", r.train_components},
          {"epoch_seconds", r.epoch_seconds}, {"final", r.final}};
}

EpochRecord record_from_json(const nlohmann::json& j) {
  EpochRecord r;
  r.epoch = j.at("epoch").get<int64_t>();
  r.step = j.at("step").get<int64_t>();
  r.batches = j.at("batches").get<int64_t>();
  r.structures = j.at("structures").get<int64_t>();
  r.train_loss = j.at("train_loss").is_null() ? std::nan("") : j.at("train_loss").get<double>();
  for (const auto& [k, v] : j.at("train_components").items()) {
    r.train_components[k] = v.is_null() ? std::nan("") : v.get<double>();
  }
  r.epoch_seconds = j.at("epoch_seconds").get<double>();
  r.final = j.at("final").get<bool>();
  return r;
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
  if (!resume_state_) return;
  const nlohmann::json j = nlohmann::json::parse(*resume_state_);
  resume_state_.reset();
  current_ = record_from_json(j.at("current"));
  epoch_open_ = j.at("epoch_open").get<bool>();
  last_emitted_step_ = j.at("last_emitted_step").get<int64_t>();
  last_emitted_validated_ = j.at("last_emitted_validated").get<bool>();
  if (!j.at("last_record").is_null()) records_.push_back(record_from_json(j.at("last_record")));
}

std::string EpochReportHook::state_json() const {
  nlohmann::json j;
  j["current"] = record_to_json(current_);
  j["epoch_open"] = epoch_open_;
  j["last_emitted_step"] = last_emitted_step_;
  j["last_emitted_validated"] = last_emitted_validated_;
  j["last_record"] = records_.empty() ? nlohmann::json() : record_to_json(records_.back());
  return j.dump();
}

void EpochReportHook::resume_from(const std::string& state_json, const std::string& source) {
  try {
    const nlohmann::json j = nlohmann::json::parse(state_json);
    (void)record_from_json(j.at("current"));  // every key readable now, not at enter()
    (void)j.at("epoch_open").get<bool>();
    (void)j.at("last_emitted_step").get<int64_t>();
    (void)j.at("last_emitted_validated").get<bool>();
    if (!j.at("last_record").is_null()) (void)record_from_json(j.at("last_record"));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(source + ": must be the metrics state of a checkpoint, got " + e.what());
  }
  resume_state_ = state_json;
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

// ---------------------------------------------------------- progress bar ----

namespace {
/// "m:ss" or "h:mm:ss"; "--:--" when unknown.
std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  if (h > 0) return fmt::format("{}:{:02}:{:02}", h, m, s);
  return fmt::format("{}:{:02}", m, s);
}
}  // namespace

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) != 0; }

ProgressBarHook::ProgressBarHook(std::ostream& out, int64_t batches_per_epoch,
                                 int64_t total_epochs, ProgressBarOptions options)
    : out_(out),
      batches_per_epoch_(batches_per_epoch),
      total_epochs_(total_epochs),
      options_(std::move(options)) {
  if (batches_per_epoch_ < 1) {
    throw std::invalid_argument("ProgressBarHook batches_per_epoch must be >= 1, got " +
                                std::to_string(batches_per_epoch_));
  }
  if (total_epochs_ < 0) {
    throw std::invalid_argument("ProgressBarHook total_epochs must be >= 0, got " +
                                std::to_string(total_epochs_));
  }
  if (!(options_.min_redraw_seconds >= 0)) {
    throw std::invalid_argument("ProgressBarOptions.min_redraw_seconds must be >= 0, got " +
                                std::to_string(options_.min_redraw_seconds));
  }
  if (options_.bar_width < 1) {
    throw std::invalid_argument("ProgressBarOptions.bar_width must be >= 1, got " +
                                std::to_string(options_.bar_width));
  }
}

bool ProgressBarHook::runs_on_stage(TrainingStage stage) const {
  if (!options_.tty) return false;
  return stage == TrainingStage::BEFORE_EPOCH || stage == TrainingStage::AFTER_BATCH ||
         stage == TrainingStage::AFTER_VALIDATION || stage == TrainingStage::AFTER_TRAINING;
}

double ProgressBarHook::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ProgressBarHook::enter() {
  line_open_ = epoch_open_ = false;
  epoch_ = done_ = seen_ = structures_ = loss_count_ = 0;
  loss_mean_ = 0;
  last_width_ = 0;
  redraws_ = 0;
}

void ProgressBarHook::exit(bool failed) {
  (void)failed;
  try {
    finish_line();
  } catch (...) {
  }
}

void ProgressBarHook::operator()(TrainContext& ctx, TrainingStage stage) {
  if (!options_.tty) return;
  switch (stage) {
    case TrainingStage::BEFORE_EPOCH:
      finish_line();
      epoch_open_ = true;
      epoch_ = ctx.epoch_count + 1;
      done_ = seen_ = structures_ = loss_count_ = 0;
      loss_mean_ = 0;
      epoch_start_ = now();
      break;
    case TrainingStage::AFTER_BATCH: {
      epoch_ = ctx.epoch_count + 1;
      done_ = ctx.epoch_step_count;
      if (!epoch_open_) {  // restarted mid-epoch: time from this batch on
        epoch_open_ = true;
        seen_ = structures_ = loss_count_ = 0;
        loss_mean_ = 0;
        epoch_start_ = now();
      } else {
        ++seen_;
        if (ctx.batch) structures_ += ctx.batch->num_graphs();
      }
      if (ctx.loss.defined()) {
        const double l = ctx.loss.item<double>();
        ++loss_count_;
        loss_mean_ += (l - loss_mean_) / static_cast<double>(loss_count_);
      }
      const bool epoch_end = done_ >= batches_per_epoch_;
      draw(epoch_end || done_ <= 1);
      if (epoch_end) {
        finish_line();
        epoch_open_ = false;
      }
      break;
    }
    case TrainingStage::AFTER_VALIDATION:
      if (line_open_) {  // a mid-epoch validation: make room for its report line
        out_ << '\r' << std::string(last_width_, ' ') << '\r';
        out_.flush();
        line_open_ = false;
        last_width_ = 0;
      }
      break;
    case TrainingStage::AFTER_TRAINING:
      if (epoch_open_ && done_ > 0) draw(true);
      finish_line();
      epoch_open_ = false;
      break;
    default:
      break;
  }
}

void ProgressBarHook::draw(bool force) {
  const double t = now();
  if (!force && line_open_ && t - last_draw_ < options_.min_redraw_seconds) return;
  last_draw_ = t;

  std::string line;
  if (total_epochs_ > 0) {
    const int width = static_cast<int>(std::to_string(total_epochs_).size());
    line = fmt::format("epoch {:>{}}/{} ", epoch_, width, total_epochs_);
  } else {
    line = fmt::format("epoch {:>4} ", epoch_);
  }
  const int64_t done = std::min(done_, batches_per_epoch_);
  const int bw = options_.bar_width;
  const auto filled = static_cast<int>(done * bw / batches_per_epoch_);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < bw) {
    bar += done > 0 ? ">" : " ";
    bar += std::string(static_cast<size_t>(bw - filled - 1), ' ');
  }
  const int cw = static_cast<int>(std::to_string(batches_per_epoch_).size());
  line += fmt::format("[{}] {:>{}}/{}", bar, done, cw, batches_per_epoch_);

  const double elapsed = t - epoch_start_;
  const bool has_rate = seen_ > 0 && elapsed > 0;
  const double rate = has_rate ? static_cast<double>(seen_) / elapsed : 0.0;
  if (has_rate) {
    line += fmt::format("  {:.1f} batch/s  {:.1f} struct/s", rate,
                        static_cast<double>(structures_) / elapsed);
  } else {
    line += "  -- batch/s  -- struct/s";
  }
  const int64_t left = batches_per_epoch_ - done;
  const double nan = std::nan("");
  line += "  ETA " + format_duration(has_rate ? static_cast<double>(left) / rate : nan);
  if (total_epochs_ > 0) {
    const int64_t later = std::max<int64_t>(0, total_epochs_ - epoch_) * batches_per_epoch_;
    line += " (run " +
            format_duration(has_rate ? static_cast<double>(left + later) / rate : nan) + ")";
  }
  if (loss_count_ > 0) line += fmt::format("  loss {:.4e}", loss_mean_);

  const size_t width = line.size();
  if (width < last_width_) line += std::string(last_width_ - width, ' ');
  out_ << '\r' << line;
  out_.flush();
  last_width_ = width;
  line_open_ = true;
  ++redraws_;
}

void ProgressBarHook::finish_line() {
  if (!line_open_) return;
  out_ << '\n';
  out_.flush();
  line_open_ = false;
  last_width_ = 0;
}

// ------------------------------------------------------------------ csv ----

MetricsCsvHook::MetricsCsvHook(std::string path, std::vector<std::string> loss_terms, bool append)
    : path_(std::move(path)), loss_terms_(std::move(loss_terms)), append_(append) {}

void MetricsCsvHook::enter() {
  EpochReportHook::enter();
  file_.close();
  file_.clear();
  std::error_code ec;
  if (truncate_to_) {
    // A resumed run: rows after the checkpoint go (issue 15); never padded (issue 47).
    cut_back_to_checkpoint(path_, *truncate_to_);
    truncate_to_.reset();
  }
  const bool has_rows = append_ && std::filesystem::file_size(path_, ec) > 0 && !ec;
  file_.open(path_, std::ios::out | (has_rows ? std::ios::app : std::ios::trunc));
  if (!file_) throw DataError(path_ + ": metrics file cannot be created");
  bytes_ = has_rows ? std::filesystem::file_size(path_, ec) : 0;
  if (has_rows) return;
  std::string header = "epoch,step,elapsed_s,train_loss";
  for (const auto& t : loss_terms_) header += ",train_loss_" + t;
  for (const auto& m : validation_metric_names()) header += ",valid_" + m;
  write_checked(header + "\n");
}

void MetricsCsvHook::write_checked(const std::string& text) {
  errno = 0;
  file_ << text;
  file_.flush();
  if (!file_) {
    const int e = errno;
    file_.close();
    throw MetricsWriteError(path_ + ": a metrics row could not be written (" +
                            (e ? std::strerror(e) : "write failed") + ")");
  }
  bytes_ += text.size();
}

void MetricsCsvHook::exit(bool failed) {
  (void)failed;
  file_.flush();
  file_.close();
}

void MetricsCsvHook::report(const EpochRecord& r) {
  if (!file_.is_open()) return;
  auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.10g}", v) : std::string(); };
  std::string row = fmt::format("{},{},{:.3f},{}", r.epoch, r.step, r.elapsed_seconds, num(r.train_loss));
  for (const auto& t : loss_terms_) {
    auto it = r.train_components.find(t);
    row += "," + (it == r.train_components.end() ? std::string() : num(it->second));
  }
  const auto metrics = r.validation ? r.validation->as_map() : std::map<std::string, double>{};
  for (const auto& m : validation_metric_names()) {
    auto it = metrics.find(m);
    row += "," + (it == metrics.end() ? std::string() : num(it->second));
  }
  write_checked(row + "\n");
}

}  // namespace crucible
