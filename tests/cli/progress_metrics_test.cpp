// In-process tests of the live progress bar, metrics.jsonl and
// learning_curve.svg, with a real TrainingStrategy on a few TiAl frames.

#include "crucible/report/learning_curve.h"
#include "crucible/report/metrics_log.h"
#include "crucible/report/progress.h"
#include "crucible/common/error.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/schnet.h"
#include "crucible/training/strategy.h"

#include "cli/e2e_helpers.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace crucible {
namespace {

using e2e::count_occurrences;
using e2e::read_text;
using e2e::temp_dir;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  return lines;
}

/// A tiny run: 6 training frames in batches of 2 (3 batches per epoch), 2
/// validation frames without stress labels (so the stress metrics are NaN),
/// validated after every epoch, tiny float64 SchNet, cosine schedule.
struct TinyRun {
  std::shared_ptr<AtomicDataset> train_ds, valid_ds;
  SchNet model{nullptr};
  StrategyOptions options;
  WeightedSumLoss loss;

  explicit TinyRun(int64_t epochs) {
    at::manual_seed(0);
    auto all = read_extxyz(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
    all.resize(8);
    std::vector<Structure> train(all.begin(), all.begin() + 6);
    std::vector<Structure> valid(all.begin() + 6, all.end());
    for (auto& s : valid) s.stress.reset();
    train_ds = std::make_shared<AtomicDataset>(train, 4.0);
    valid_ds = std::make_shared<AtomicDataset>(valid, 4.0);
    SchNetOptions o;
    o.hidden_channels = 8;
    o.num_filters = 8;
    o.num_interactions = 1;
    o.num_gaussians = 6;
    o.cutoff = 4.0;
    model = SchNet(o);
    model->to(at::kDouble);
    options.num_epochs = epochs;
    options.dtype = at::kDouble;
    options.optimizer.lr = 1e-2;
    SchedulerConfig cosine;
    cosine.name = "cosine";
    cosine.final_lr_factor = 0.1;
    options.optimizer.scheduler = cosine;
    ValidationConfig vc;
    vc.data = valid_ds;
    vc.every_n_epochs = 1;
    options.validation = vc;
    loss.add(std::make_shared<EnergyMSELoss>(true), 1.0);
    loss.add(std::make_shared<ForcesMSELoss>(), 1.0);
  }
  DataLoader loader() const { return DataLoader(train_ds, DataLoaderOptions{2, true, 0, false}); }
};

/// Collects the total loss of every batch by step (AFTER_BATCH), the lr each
/// optimizer step used (BEFORE_OPTIMIZER_STEP) and the number of validations.
struct Probe {
  std::map<int64_t, double> loss_at_step;
  std::map<int64_t, std::map<std::string, double>> components_at_step;
  std::map<int64_t, double> lr_of_step;  // keyed by the step count after the step
  std::map<int64_t, std::vector<double>> epoch_losses;  // 1-based epoch → batch losses
  int64_t validations = 0;

  std::vector<std::shared_ptr<Hook>> hooks() {
    return {std::make_shared<LambdaHook>(
        "probe",
        std::set<TrainingStage>{TrainingStage::BEFORE_OPTIMIZER_STEP, TrainingStage::AFTER_BATCH,
                                TrainingStage::AFTER_VALIDATION},
        [this](TrainContext& ctx, TrainingStage stage) {
          if (stage == TrainingStage::BEFORE_OPTIMIZER_STEP) {
            lr_of_step[ctx.step_count + 1] =
                ctx.optimizers.at(0)->param_groups().at(0).options().get_lr();
          } else if (stage == TrainingStage::AFTER_BATCH) {
            const double l = ctx.loss.item<double>();
            loss_at_step[ctx.step_count] = l;
            for (const auto& [k, v] : ctx.losses->components) {
              components_at_step[ctx.step_count][k] = v.item<double>();
            }
            epoch_losses[ctx.epoch_count + 1].push_back(l);
          } else {
            ++validations;
          }
        })};
  }
};

// ------------------------------------------------------------ progress bar --

TEST(ProgressBar, RejectsBadArguments) {
  std::ostringstream out;
  EXPECT_THROW(ProgressBarHook(out, 0, 3), std::invalid_argument);
  EXPECT_THROW(ProgressBarHook(out, 3, -1), std::invalid_argument);
  ProgressBarOptions bad;
  bad.min_redraw_seconds = -1;
  EXPECT_THROW(ProgressBarHook(out, 3, 3, bad), std::invalid_argument);
  ProgressBarOptions narrow;
  narrow.bar_width = 0;
  EXPECT_THROW(ProgressBarHook(out, 3, 3, narrow), std::invalid_argument);
}

TEST(ProgressBar, TtyRedrawsInPlaceAndNonTtyPrintsNothingInARealRun) {
  TinyRun run(3);
  std::ostringstream tty_text, plain_text;
  ProgressBarOptions tty;
  tty.tty = true;
  tty.min_redraw_seconds = 0;
  double fake_now = 100.0;
  tty.clock = [&fake_now] { return fake_now += 0.25; };  // one call per event
  ProgressBarOptions plain = tty;
  plain.tty = false;
  auto bar = std::make_shared<ProgressBarHook>(tty_text, 3, 3, tty);
  auto silent = std::make_shared<ProgressBarHook>(plain_text, 3, 3, plain);
  // Registered after the bar, as `crucible train` should: its epoch line
  // must start on a line of its own.
  auto lines = std::make_shared<ProgressHook>(tty_text, 3);
  Probe probe;
  TrainingStrategy strategy(run.model.ptr(), run.options, run.loss, {bar, silent, lines});
  for (auto& h : probe.hooks()) strategy.register_hook(h);
  DataLoader loader = run.loader();
  strategy.run(loader);

  EXPECT_EQ(plain_text.str(), "");
  EXPECT_EQ(silent->redraws(), 0);

  const std::string text = tty_text.str();
  EXPECT_EQ(bar->redraws(), 9) << text;  // min_redraw_seconds 0: every batch
  EXPECT_EQ(count_occurrences(text, "\r"), 9u) << text;
  EXPECT_NE(text.find("\repoch 1/3 ["), std::string::npos) << text;
  EXPECT_NE(text.find("\repoch 3/3 ["), std::string::npos) << text;
  // The fake clock advances 0.25 s per event: 4 batches/s, 2 structures each.
  EXPECT_NE(text.find("4.0 batch/s  8.0 struct/s"), std::string::npos) << text;
  EXPECT_NE(text.find("ETA "), std::string::npos) << text;

  // 3 bar lines (one per epoch, finished with '\n') + 3 ProgressHook lines
  // (one per validated epoch; the final validation at the same step adds
  // none); the latter never share a line with the bar.
  const auto all = split_lines(text);
  std::vector<std::string> bar_lines, report_lines;
  for (const auto& l : all) (l.find('\r') != std::string::npos ? bar_lines : report_lines).push_back(l);
  ASSERT_EQ(bar_lines.size(), 3u) << text;
  ASSERT_EQ(report_lines.size(), 3u) << text;
  for (size_t i = 0; i < report_lines.size(); ++i) {
    EXPECT_EQ(report_lines[i].rfind(fmt::format("epoch {}/3  step", i + 1), 0), 0u) << report_lines[i];
  }
  for (int e = 1; e <= 3; ++e) {
    const std::string& l = bar_lines[static_cast<size_t>(e - 1)];
    // The last redraw of the line: the full bar, 3/3 batches, the epoch's mean loss.
    const std::string last = l.substr(l.rfind('\r') + 1);
    EXPECT_EQ(last.rfind(fmt::format("epoch {}/3 [========================] 3/3", e), 0), 0u) << last;
    const auto& losses = probe.epoch_losses.at(e);
    ASSERT_EQ(losses.size(), 3u);
    const double mean = (losses[0] + losses[1] + losses[2]) / 3.0;
    EXPECT_NE(last.find(fmt::format("loss {:.4e}", mean)), std::string::npos) << last;
    // Epoch ETA 0 at its end; the run ETA counts the later epochs (3 batches at 4/s each).
    EXPECT_NE(last.find(fmt::format("ETA 0:00 (run 0:{:02})",
                                    static_cast<int>(std::llround((3 - e) * 3 / 4.0)))),
              std::string::npos)
        << last;
    // The first redraw shows a partial bar.
    EXPECT_NE(l.find(fmt::format("\repoch {}/3 [========>", e)), std::string::npos) << l;
  }
}

/// A synthetic AFTER_BATCH context (no strategy needed).
TrainContext batch_ctx(int64_t epoch_step, double loss) {
  TrainContext ctx;
  ctx.epoch_count = 0;
  ctx.epoch_step_count = epoch_step;
  ctx.step_count = epoch_step;
  ctx.loss = at::scalar_tensor(loss, at::kDouble);
  return ctx;
}

TEST(ProgressBar, RedrawsAreThrottledByTheClock) {
  for (const double min_redraw : {0.0, 0.2}) {
    std::ostringstream out;
    ProgressBarOptions o;
    o.tty = true;
    o.min_redraw_seconds = min_redraw;
    double t = 0;
    o.clock = [&t] { return t += 0.05; };
    ProgressBarHook hook(out, 20, 0, o);
    hook.enter();
    TrainContext start = batch_ctx(0, 0);
    hook(start, TrainingStage::BEFORE_EPOCH);
    for (int64_t k = 1; k <= 20; ++k) {
      TrainContext ctx = batch_ctx(k, 1.0);
      hook(ctx, TrainingStage::AFTER_BATCH);
    }
    hook.exit(false);
    const std::string text = out.str();
    if (min_redraw == 0) {
      EXPECT_EQ(hook.redraws(), 20) << text;
    } else {
      // First and last batch always, otherwise at most one redraw per 0.2 s
      // of the (fake) clock, which advances 0.05 s per batch.
      EXPECT_GE(hook.redraws(), 2) << text;
      EXPECT_LE(hook.redraws(), 7) << text;
    }
    EXPECT_EQ(count_occurrences(text, "\n"), 1u) << text;  // one epoch line, finished once
    EXPECT_NE(text.find("epoch    1 ["), std::string::npos) << text;  // no total: no "/N"
    EXPECT_EQ(text.find("(run"), std::string::npos) << text;            // no run ETA
    EXPECT_NE(text.find("20/20"), std::string::npos) << text;
  }
}

TEST(ProgressBar, ExitFinishesAnOpenLine) {
  std::ostringstream out;
  ProgressBarOptions o;
  o.tty = true;
  o.min_redraw_seconds = 0;
  ProgressBarHook hook(out, 10, 2, o);
  hook.enter();
  TrainContext ctx = batch_ctx(1, 0.5);
  hook(ctx, TrainingStage::AFTER_BATCH);
  EXPECT_EQ(out.str().front(), '\r');
  EXPECT_EQ(count_occurrences(out.str(), "\n"), 0u);
  hook.exit(true);
  EXPECT_EQ(count_occurrences(out.str(), "\n"), 1u);
  EXPECT_EQ(out.str().back(), '\n');
}

// ---------------------------------------------------------- metrics.jsonl --

TEST(MetricsJsonl, RejectsBadArgumentsAndUncreatableFiles) {
  MetricsJsonlOptions o;
  o.log_every_n_steps = 0;
  EXPECT_THROW(MetricsJsonlHook("x.jsonl", o), std::invalid_argument);
  const std::string bad = "/nonexistent_dir_crucible/metrics.jsonl";
  MetricsJsonlHook hook(bad);
  try {
    hook.enter();
    ADD_FAILURE() << "enter() must throw";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

TEST(MetricsJsonl, LinesMatchTheRunAndTheCurveIsWritten) {
  TinyRun run(3);
  const fs::path dir = temp_dir("crucible_metrics_jsonl_test");
  MetricsJsonlOptions mo;
  mo.log_every_n_steps = 2;
  mo.learning_curve_path = (dir / "learning_curve.svg").string();
  auto metrics = std::make_shared<MetricsJsonlHook>((dir / "metrics.jsonl").string(), mo);
  Probe probe;
  TrainingStrategy strategy(run.model.ptr(), run.options, run.loss, {metrics});
  for (auto& h : probe.hooks()) strategy.register_hook(h);
  DataLoader loader = run.loader();
  strategy.run(loader);
  ASSERT_EQ(strategy.step_count, 9);
  ASSERT_EQ(probe.validations, 4);  // after each of 3 epochs + after training

  std::vector<json> train, valid;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);  // throws (fails the test) if a line is not JSON
    ASSERT_TRUE(j.is_object()) << line;
    (j.at("type") == "train" ? train : valid).push_back(j);
  }
  // Steps 1, 3, 5, 7, 9: ceil(9 / 2) lines.
  ASSERT_EQ(train.size(), 5u);
  int64_t prev = 0;
  for (size_t i = 0; i < train.size(); ++i) {
    const json& j = train[i];
    const int64_t step = j.at("step").get<int64_t>();
    EXPECT_EQ(step, static_cast<int64_t>(1 + 2 * i));
    EXPECT_GT(step, prev);
    prev = step;
    EXPECT_EQ(j.at("epoch").get<int64_t>(), (step - 1) / 3 + 1) << j;
    EXPECT_EQ(j.at("batch").get<int64_t>(), (step - 1) % 3 + 1) << j;
    EXPECT_DOUBLE_EQ(j.at("loss").get<double>(), probe.loss_at_step.at(step)) << j;
    EXPECT_DOUBLE_EQ(j.at("loss_energy").get<double>(), probe.components_at_step.at(step).at("energy"));
    EXPECT_DOUBLE_EQ(j.at("loss_forces").get<double>(), probe.components_at_step.at(step).at("forces"));
    EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), probe.lr_of_step.at(step)) << j;
    EXPECT_GE(j.at("elapsed_s").get<double>(), 0.0);
  }
  // The cosine schedule moved the lr: step 1 uses the initial 1e-2.
  EXPECT_DOUBLE_EQ(train[0].at("lr").get<double>(), 1e-2);
  EXPECT_LT(train[4].at("lr").get<double>(), 1e-2);

  // Issue 47: epochs 1-3 end at steps 3, 6, 9; the final validation of the
  // same weights at step 9 is not written a second time.
  ASSERT_EQ(valid.size(), 3u);
  for (size_t i = 0; i < valid.size(); ++i) {
    const json& j = valid[i];
    EXPECT_EQ(j.at("step").get<int64_t>(), static_cast<int64_t>(3 * (i + 1))) << j;
    EXPECT_FALSE(j.at("final").get<bool>()) << j;
    EXPECT_EQ(j.at("num_structures").get<int64_t>(), 2);
    EXPECT_FALSE(j.at("inference_model").get<bool>());
    EXPECT_TRUE(j.at("stress_mae").is_null()) << j;  // NaN (no stress labels) → null
    EXPECT_TRUE(j.at("energy_mae").is_number()) << j;
    for (const char* m : {"energy_rmse", "forces_mae", "forces_rmse", "stress_rmse", "zero_forces_mae"}) {
      EXPECT_TRUE(j.contains(m)) << m;
    }
  }
  ASSERT_TRUE(strategy.last_validation().has_value());
  EXPECT_DOUBLE_EQ(valid.back().at("forces_mae").get<double>(), strategy.last_validation()->forces_mae);
  EXPECT_DOUBLE_EQ(valid.back().at("energy_mae").get<double>(), strategy.last_validation()->energy_mae);

  // The curve held by the hook and the one read back from the file agree.
  const LearningCurve back = read_learning_curve_jsonl((dir / "metrics.jsonl").string());
  ASSERT_EQ(back.train.size(), 5u);
  ASSERT_EQ(back.validation.size(), 3u);  // the final repeat of step 9 is not written (issue 47)
  ASSERT_EQ(metrics->curve().train.size(), 5u);
  EXPECT_DOUBLE_EQ(back.train[2].loss, metrics->curve().train[2].loss);
  EXPECT_DOUBLE_EQ(back.validation[2].forces_mae, strategy.last_validation()->forces_mae);

  // learning_curve.svg: written at exit, atomically, one polyline per series.
  EXPECT_TRUE(metrics->curve_error().empty()) << metrics->curve_error();
  EXPECT_FALSE(fs::exists(dir / "learning_curve.svg.tmp"));
  const std::string svg = read_text(dir / "learning_curve.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count_occurrences(svg, "<polyline"), 3u) << svg;
  EXPECT_EQ(count_occurrences(svg, "<svg"), 1u);
  for (const char* text : {"optimizer step", "training loss", "validation MAE", "train loss",
                           "energy MAE (meV/atom)", "force MAE (meV/Å)"}) {
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  }
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("no data"), std::string::npos);
  fs::remove_all(dir);
}

// --------------------------------------------------------- learning curve --

TEST(LearningCurve, IsWrittenWhenTheRunThrowsMidway) {
  TinyRun run(3);
  const fs::path dir = temp_dir("crucible_learning_curve_crash_test");
  MetricsJsonlOptions mo;
  mo.log_every_n_steps = 2;
  mo.learning_curve_path = (dir / "learning_curve.svg").string();
  auto metrics = std::make_shared<MetricsJsonlHook>((dir / "metrics.jsonl").string(), mo);
  auto crash = std::make_shared<LambdaHook>(
      "crash", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
      [](TrainContext& ctx, TrainingStage) {
        if (ctx.step_count == 5) throw std::runtime_error("boom at step 5");
      });
  TrainingStrategy strategy(run.model.ptr(), run.options, run.loss, {metrics, crash});
  DataLoader loader = run.loader();
  EXPECT_THROW(strategy.run(loader), std::runtime_error);

  // Lines for steps 1, 3, 5 (the metrics hook ran before the crash) and the
  // validation after epoch 1.
  const auto lines = split_lines(read_text(dir / "metrics.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(json::parse(lines[2]).at("type"), "validation");
  EXPECT_EQ(json::parse(lines[3]).at("step"), 5);

  ASSERT_TRUE(fs::exists(dir / "learning_curve.svg"));
  const std::string svg = read_text(dir / "learning_curve.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count_occurrences(svg, "<polyline"), 3u) << svg;
  fs::remove_all(dir);
}

TEST(LearningCurve, SkipsNonPositiveValuesAndRendersSinglePoints) {
  LearningCurve c;
  const double nan = std::nan("");
  c.train = {{1, nan}, {2, 0.0}, {3, -1.0}, {4, 0.5}};
  c.validation = {{4, nan, 12.5}};
  const std::string svg = learning_curve_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  // Train loss: one plottable point; forces: one; energy: none.
  EXPECT_EQ(count_occurrences(svg, "<polyline"), 2u) << svg;
  EXPECT_EQ(count_occurrences(svg, "<circle"), 2u) << svg;  // single points get a visible marker
  EXPECT_NE(svg.find("energy MAE (meV/atom) (no data)"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("inf"), std::string::npos) << svg;
  // Each polyline has exactly one point.
  for (size_t p = svg.find("points=\""); p != std::string::npos; p = svg.find("points=\"", p + 1)) {
    const size_t end = svg.find('"', p + 8);
    EXPECT_EQ(svg.substr(p + 8, end - p - 8).find(' '), std::string::npos);
  }

  const std::string empty = learning_curve_svg(LearningCurve{});
  EXPECT_EQ(count_occurrences(empty, "<polyline"), 0u);
  EXPECT_EQ(count_occurrences(empty, ">no data<"), 2u) << empty;
  EXPECT_EQ(empty.substr(empty.size() - 7), "</svg>\n");
}

TEST(LearningCurve, WriteFailuresAreDataErrorsButNeverEscapeExit) {
  LearningCurve c;
  c.train = {{1, 1.0}};
  const std::string bad = "/nonexistent_dir_crucible/learning_curve.svg";
  try {
    write_learning_curve_svg(bad, c);
    ADD_FAILURE() << "write_learning_curve_svg must throw";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }

  const fs::path dir = temp_dir("crucible_learning_curve_exit_test");
  MetricsJsonlOptions mo;
  mo.learning_curve_path = bad;
  MetricsJsonlHook hook((dir / "metrics.jsonl").string(), mo);
  hook.enter();
  EXPECT_NO_THROW(hook.exit(false));
  EXPECT_NE(hook.curve_error().find(bad), std::string::npos) << hook.curve_error();
  // A failed run without data writes no picture.
  mo.learning_curve_path = (dir / "learning_curve.svg").string();
  MetricsJsonlHook empty((dir / "metrics.jsonl").string(), mo);
  empty.enter();
  empty.exit(true);
  EXPECT_FALSE(fs::exists(dir / "learning_curve.svg"));
  // A successful one always does.
  empty.enter();
  empty.exit(false);
  EXPECT_TRUE(fs::exists(dir / "learning_curve.svg"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace crucible
