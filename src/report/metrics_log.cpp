// metrics.jsonl hook and the learning curve written at its exit.

#include "crucible/report/metrics_log.h"

#include <cstring>

#include <cerrno>

#include <filesystem>
#include <iterator>
#include <fstream>
#include <iostream>

#include "crucible/common/error.h"
#include "crucible/losses/loss.h"
#include "crucible/training/metrics.h"

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <stdexcept>

namespace crucible {

namespace {

using ordered_json = nlohmann::ordered_json;

/// A number, or null when not finite.
ordered_json number(double v) { return std::isfinite(v) ? ordered_json(v) : ordered_json(); }

double first_group_lr(torch::optim::Optimizer* opt) {
  if (!opt || opt->param_groups().empty()) return std::nan("");
  return opt->param_groups().front().options().get_lr();
}

}  // namespace

MetricsJsonlHook::MetricsJsonlHook(std::string path, MetricsJsonlOptions options)
    : path_(std::move(path)), options_(std::move(options)) {
  if (options_.log_every_n_steps < 1) {
    throw std::invalid_argument("MetricsJsonlOptions.log_every_n_steps must be >= 1, got " +
                                std::to_string(options_.log_every_n_steps));
  }
}

void cut_back_to_checkpoint(const std::string& path, uint64_t bytes) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    std::cerr << "crucible: warning: " << path << " is missing (the checkpoint recorded " << bytes
              << " bytes); a new one starts here, without the rows before the checkpoint\n";
    return;
  }
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw DataError(path + ": metrics file cannot be read (" + ec.message() + ")");
  uint64_t keep = bytes;
  if (size < bytes) {  // never pad: keep what is there, up to its last complete line
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t newline = text.rfind('\n');
    keep = newline == std::string::npos ? 0 : static_cast<uint64_t>(newline + 1);
    std::cerr << "crucible: warning: " << path << " has " << size << " bytes, fewer than the " << bytes
              << " the checkpoint recorded (edited or cut?); rows continue after its last complete line, and "
                 "the rows it lost are not restored\n";
  }
  if (keep != size) {
    std::filesystem::resize_file(path, keep, ec);
    if (ec) throw DataError(path + ": metrics file cannot be cut back to the checkpoint (" + ec.message() + ")");
  }
}

bool MetricsJsonlHook::runs_on_stage(TrainingStage stage) const {
  return stage == TrainingStage::BEFORE_OPTIMIZER_STEP || stage == TrainingStage::AFTER_BATCH ||
         stage == TrainingStage::AFTER_TRAINING || stage == TrainingStage::AFTER_VALIDATION;
}

void MetricsJsonlHook::enter() {
  file_.close();
  file_.clear();
  std::error_code ec;
  if (truncate_to_) {
    // A resumed run: lines after the checkpoint (and a torn last line) go.
    cut_back_to_checkpoint(path_, *truncate_to_);
    truncate_to_.reset();
  }
  const bool has_lines = options_.append && std::filesystem::file_size(path_, ec) > 0 && !ec;
  curve_ = LearningCurve{};
  if (has_lines) {
    try {
      curve_ = read_learning_curve_jsonl(path_);  // a crash may have cut the last line
    } catch (const DataError&) {
      curve_ = LearningCurve{};
    }
  }
  file_.open(path_, std::ios::out | (has_lines ? std::ios::app : std::ios::trunc));
  if (!file_) throw DataError(path_ + ": metrics file cannot be created");
  bytes_ = has_lines ? std::filesystem::file_size(path_, ec) : 0;
  start_ = std::chrono::steady_clock::now();
  step_lrs_.clear();
  training_done_ = false;
  lines_ = 0;
  curve_error_.clear();
}

void MetricsJsonlHook::write_line(const std::string& line) {
  if (!file_.is_open()) return;
  errno = 0;
  file_ << line << '\n';
  file_.flush();
  if (!file_) {
    const int e = errno;
    file_.close();  // nothing more goes into a file that lost a line
    throw MetricsWriteError(path_ + ": a metrics line could not be written (" +
                            (e ? std::strerror(e) : "write failed") + ")");
  }
  bytes_ += line.size() + 1;
  ++lines_;
}

void MetricsJsonlHook::operator()(TrainContext& ctx, TrainingStage stage) {
  if (ctx.global_rank != 0) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  switch (stage) {
    case TrainingStage::BEFORE_OPTIMIZER_STEP:
      step_lrs_.clear();
      for (auto* opt : ctx.optimizers) step_lrs_.push_back(first_group_lr(opt));
      break;
    case TrainingStage::AFTER_BATCH: {
      if (ctx.optimizer_step_skipped || ctx.step_count < 1) break;
      if ((ctx.step_count - 1) % options_.log_every_n_steps != 0) break;
      std::vector<double> lrs = step_lrs_;
      if (lrs.size() != ctx.optimizers.size()) {  // no BEFORE_OPTIMIZER_STEP seen
        lrs.clear();
        for (auto* opt : ctx.optimizers) lrs.push_back(first_group_lr(opt));
      }
      const double loss = ctx.loss.defined() ? ctx.loss.item<double>() : std::nan("");
      ordered_json j;
      j["type"] = "train";
      j["step"] = ctx.step_count;
      j["epoch"] = ctx.epoch_count + 1;
      j["batch"] = ctx.epoch_step_count;
      j["loss"] = number(loss);
      if (ctx.losses) {
        for (const auto& [term, value] : ctx.losses->components) {
          j["loss_" + term] = number(value.defined() ? value.item<double>() : std::nan(""));
        }
      }
      if (lrs.size() == 1) {
        j["lr"] = number(lrs[0]);
      } else {
        for (size_t i = 0; i < lrs.size(); ++i) j["lr_" + std::to_string(i)] = number(lrs[i]);
      }
      j["elapsed_s"] = elapsed;
      write_line(j.dump());
      curve_.train.push_back({ctx.step_count, loss});
      break;
    }
    case TrainingStage::AFTER_TRAINING:
      training_done_ = true;
      break;
    case TrainingStage::AFTER_VALIDATION: {
      if (!ctx.validation) break;
      const ValidationSummary& v = *ctx.validation;
      // Issue 47: the final validation of the weights the last line already
      // reports (same step, same figures) is not written a second time.
      if (training_done_ && !curve_.validation.empty()) {
        const auto& last = curve_.validation.back();
        auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
        if (last.step == ctx.step_count && same(last.energy_mae, v.energy_mae) &&
            same(last.forces_mae, v.forces_mae) && same(last.stress_mae, v.stress_mae)) {
          break;
        }
      }
      ordered_json j;
      j["type"] = "validation";
      j["step"] = ctx.step_count;
      j["epoch"] = ctx.epoch_count;
      for (const auto& [metric, value] : v.as_map()) j[metric] = number(value);
      j["loss"] = number(v.loss);  // weighted, with the current stage's weights
      j["num_structures"] = v.num_structures;
      j["num_energies"] = v.num_energies;
      j["num_forces"] = v.num_forces;
      j["num_stresses"] = v.num_stresses;
      j["inference_model"] = v.inference_model;
      j["final"] = training_done_;
      j["elapsed_s"] = elapsed;
      write_line(j.dump());
      curve_.validation.push_back({ctx.step_count, v.energy_mae, v.forces_mae, v.stress_mae});
      break;
    }
    default:
      break;
  }
}

void MetricsJsonlHook::exit(bool failed) {
  try {
    file_.flush();
    file_.close();
  } catch (...) {
  }
  if (options_.learning_curve_path.empty() || (failed && curve_.empty())) return;
  try {
    write_learning_curve_svg(options_.learning_curve_path, curve_);
  } catch (const std::exception& e) {
    curve_error_ = e.what();
  } catch (...) {
    curve_error_ = options_.learning_curve_path + ": learning curve cannot be written";
  }
}

}  // namespace crucible
