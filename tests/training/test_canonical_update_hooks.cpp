// The canonical training-update hooks (seed 001's priority buckets):
// GradientAccumulationHook, GradientClippingHook, SpikeSkippingHook, EmaHook.

#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "crucible/common/error.h"
#include "crucible/precision/precision.h"
#include "crucible/training/ema.h"
#include "crucible/training/gradient_accumulation.h"
#include "crucible/training/gradient_clipping.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"
#include "crucible/training/update_hook.h"
#include "toy_model.h"
#include "training_helpers.h"

namespace crucible {
namespace {

using testing::energy_loss;
using testing::kInf;
using testing::kNaN;
using testing::params;
using testing::steps_options;
using testing::toy_structures;
using testing::ToyModel;

at::Tensor scalar(double v) { return at::scalar_tensor(v, at::kDouble); }

std::shared_ptr<LambdaUpdateHook> step_vetoer(int priority) {
  return std::make_shared<LambdaUpdateHook>(
      "vetoer",
      [](TrainContext& ctx, TrainingStage s, bool) {
        return UpdateDecision{s != TrainingStage::DO_OPTIMIZER_STEP, ctx.loss};
      },
      priority);
}

// ---------------------------------------------------------------- accumulation

TEST(GradientAccumulation, GatesZeroGradAndStepAndScalesLoss) {
  GradientAccumulationHook h(4);
  EXPECT_EQ(h.priority(), update_priority::kGradientAccumulation);
  EXPECT_EQ(h.exclusive_update_key(), std::optional<std::string>("gradient_accumulation"));
  TrainContext ctx;
  ctx.loss = scalar(2.0);
  for (int64_t b = 0; b < 8; ++b) {
    ctx.batch_count = b;
    EXPECT_EQ(h(ctx, TrainingStage::BEFORE_BATCH, false).proceed, b % 4 == 0) << b;
    EXPECT_EQ(h(ctx, TrainingStage::DO_OPTIMIZER_STEP, false).proceed, b % 4 == 3) << b;
    EXPECT_DOUBLE_EQ(h(ctx, TrainingStage::DO_BACKWARD, false).loss.item<double>(), 0.5);
  }
  GradientAccumulationHook one(1);
  EXPECT_TRUE(one(ctx, TrainingStage::BEFORE_BATCH, false).proceed);
  EXPECT_TRUE(one(ctx, TrainingStage::DO_OPTIMIZER_STEP, false).proceed);
  EXPECT_TRUE(one(ctx, TrainingStage::DO_BACKWARD, false).loss.is_same(ctx.loss));
  try {
    GradientAccumulationHook bad(0);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "`gradient_accumulation_steps` must be >= 1, got 0");
  }
}

TEST(GradientAccumulation, FourBatchesOfTwoEqualOneBatchOfEight) {
  // Energy MSE is a mean over structures, so the mean of four equal-size
  // (2-structure) batch means is the mean over the 8 structures.
  auto data = std::make_shared<AtomicDataset>(toy_structures(8, 7), 4.0);
  ToyModel accumulated, reference;
  TrainingStrategy acc(accumulated.ptr(), steps_options(3), energy_loss(),
                       {std::make_shared<GradientAccumulationHook>(4)});
  DataLoader small(data, {2, false, 0, false});
  acc.run(small);
  TrainingStrategy ref(reference.ptr(), steps_options(3), energy_loss());
  DataLoader big(data, {8, false, 0, false});
  ref.run(big);
  EXPECT_EQ(acc.step_count, 3);
  EXPECT_EQ(acc.batch_count, 12);
  EXPECT_EQ(ref.step_count, 3);
  const auto pa = params(accumulated);
  const auto pr = params(reference);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(pa[i], pr[i], 1e-10) << "param " << i;
    EXPECT_NE(pr[i], params(ToyModel())[i]);  // training moved every parameter
  }
}

// ---------------------------------------------------------------- clipping

struct Grads {
  at::Tensor p = at::zeros({3}, at::kDouble).requires_grad_(true);
  at::Tensor q = at::zeros({1}, at::kDouble).requires_grad_(true);
  torch::optim::SGD sgd{std::vector<at::Tensor>{p, q}, torch::optim::SGDOptions(1.0)};
  Grads(std::vector<double> gp, double gq) {
    p.mutable_grad() = at::tensor(gp, at::kDouble);
    q.mutable_grad() = at::full({1}, gq, at::kDouble);
  }
};

TEST(GradientClipping, ByNormMatchesClipGradNorm) {
  Grads g({3.0, 4.0, 0.0}, 12.0);  // total 2-norm 13
  GradientClippingHook h(GradientClippingOptions{1.3, 2.0, std::nullopt});
  EXPECT_EQ(h.priority(), update_priority::kGradientClipping);
  TrainContext ctx;
  ctx.optimizers = {&g.sgd};
  EXPECT_TRUE(h(ctx, TrainingStage::DO_OPTIMIZER_STEP, false).proceed);
  ASSERT_TRUE(h.last_total_norm().has_value());
  EXPECT_DOUBLE_EQ(*h.last_total_norm(), 13.0);
  const double coef = 1.3 / (13.0 + 1e-6);  // torch.nn.utils.clip_grad_norm_
  EXPECT_TRUE(at::allclose(g.p.grad(), at::tensor({3.0 * coef, 4.0 * coef, 0.0}, at::kDouble),
                           1e-14, 1e-14));
  EXPECT_NEAR(g.q.grad().item<double>(), 12.0 * coef, 1e-14);
  // Below the limit: unchanged.
  Grads small({0.3, 0.4, 0.0}, 0.0);
  ctx.optimizers = {&small.sgd};
  h(ctx, TrainingStage::DO_OPTIMIZER_STEP, false);
  EXPECT_DOUBLE_EQ(*h.last_total_norm(), 0.5);
  EXPECT_TRUE(at::equal(small.p.grad(), at::tensor({0.3, 0.4, 0.0}, at::kDouble)));
  // Infinity norm: max |g| = 12.
  Grads gi({3.0, -4.0, 0.0}, -12.0);
  GradientClippingHook hi(GradientClippingOptions{6.0, kInf, std::nullopt});
  ctx.optimizers = {&gi.sgd};
  hi(ctx, TrainingStage::DO_OPTIMIZER_STEP, false);
  EXPECT_DOUBLE_EQ(*hi.last_total_norm(), 12.0);
  EXPECT_NEAR(gi.q.grad().item<double>(), -12.0 * 6.0 / (12.0 + 1e-6), 1e-14);
}

TEST(GradientClipping, ByValueClamps) {
  Grads g({3.0, -4.0, 0.5}, -0.2);
  GradientClippingHook h(GradientClippingOptions{std::nullopt, 2.0, 1.0});
  TrainContext ctx;
  ctx.optimizers = {&g.sgd};
  h(ctx, TrainingStage::DO_OPTIMIZER_STEP, false);
  EXPECT_TRUE(at::equal(g.p.grad(), at::tensor({1.0, -1.0, 0.5}, at::kDouble)));
  EXPECT_DOUBLE_EQ(g.q.grad().item<double>(), -0.2);
  EXPECT_NEAR(*h.last_total_norm(), std::sqrt(9.0 + 16.0 + 0.25 + 0.04), 1e-12);
}

TEST(GradientClipping, InvalidOptionsAreConfigErrors) {
  auto msg = [](GradientClippingOptions o) {
    try {
      GradientClippingHook h(o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg({std::nullopt, 2.0, std::nullopt}),
            "`max_norm` or `clip_value` must be set (exactly one), got neither");
  EXPECT_EQ(msg({1.0, 2.0, 1.0}), "`max_norm` or `clip_value` must be set (exactly one), got both");
  EXPECT_EQ(msg({-1.0, 2.0, std::nullopt}), "`max_norm` must be finite and > 0, got -1");
  EXPECT_EQ(msg({std::nullopt, 2.0, 0.0}), "`clip_value` must be finite and > 0, got 0");
  EXPECT_EQ(msg({1.0, 0.0, std::nullopt}), "`norm_type` must be > 0 or inf, got 0");
}

TEST(GradientClipping, NoOpWhenAnEarlierHookVetoedTheStep) {
  Grads g({30.0, 40.0, 0.0}, 0.0);
  auto clip = std::make_shared<GradientClippingHook>(GradientClippingOptions{1.0, 2.0, std::nullopt});
  TrainingUpdateOrchestrator o({clip, step_vetoer(5)});
  TrainContext ctx;
  ctx.optimizers = {&g.sgd};
  o(ctx, TrainingStage::DO_OPTIMIZER_STEP);
  EXPECT_TRUE(o.optimizer_step_skipped());
  EXPECT_TRUE(at::equal(g.p.grad(), at::tensor({30.0, 40.0, 0.0}, at::kDouble)));
  EXPECT_TRUE(at::equal(g.p.detach(), at::zeros({3}, at::kDouble)));  // no step either
  EXPECT_FALSE(clip->last_total_norm().has_value());
  EXPECT_EQ(clip->clip_count(), 0);
  // Without the veto it clips and the step runs.
  TrainingUpdateOrchestrator o2({clip});
  o2(ctx, TrainingStage::DO_OPTIMIZER_STEP);
  EXPECT_EQ(clip->clip_count(), 1);
  EXPECT_NEAR(g.p.detach()[1].item<double>(), -40.0 / (50.0 + 1e-6), 1e-12);
}

TEST(GradientClipping, UnscalesThroughThePrecisionPluginFirst) {
  auto plugin = make_precision_plugin("16-mixed");
  at::Tensor p = at::zeros({2}, at::kFloat).requires_grad_(true);
  torch::optim::SGD sgd(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(1.0));
  const at::Tensor w = at::tensor({3.0f, 4.0f});  // true gradient, norm 5
  at::Tensor loss = (p * w).sum();
  at::Tensor scaled = plugin->pre_backward(loss);
  EXPECT_FLOAT_EQ(scaled.item<float>() , 0.0f);
  scaled.backward();
  ASSERT_TRUE(at::allclose(p.grad(), w * 65536.0f));
  GradientClippingHook h(GradientClippingOptions{1.0, 2.0, std::nullopt});
  TrainContext ctx;
  ctx.optimizers = {&sgd};
  ctx.precision = plugin.get();
  h(ctx, TrainingStage::DO_OPTIMIZER_STEP, false);
  EXPECT_NEAR(*h.last_total_norm(), 5.0, 1e-5);  // the true norm, not 5 * 65536
  const at::Tensor expected = w * static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_TRUE(at::allclose(p.grad(), expected, 1e-6, 1e-7)) << p.grad();
  // The step through the plugin does not unscale a second time.
  EXPECT_TRUE(plugin->optimizer_step(sgd));
  EXPECT_TRUE(at::allclose(p.detach(), -expected, 1e-6, 1e-7)) << p.detach();
}

TEST(GradientClipping, ClipsOnlyOnTheAccumulationBoundary) {
  Grads g({30.0, 40.0, 0.0}, 0.0);
  auto clip = std::make_shared<GradientClippingHook>(GradientClippingOptions{1.0, 2.0, std::nullopt});
  TrainingUpdateOrchestrator o({clip, std::make_shared<GradientAccumulationHook>(2)});
  TrainContext ctx;
  ctx.optimizers = {&g.sgd};
  ctx.batch_count = 0;  // first micro-batch: step vetoed by accumulation, no clipping
  o(ctx, TrainingStage::DO_OPTIMIZER_STEP);
  EXPECT_TRUE(o.optimizer_step_skipped());
  EXPECT_EQ(clip->clip_count(), 0);
  ctx.batch_count = 1;  // last micro-batch: clipped, then stepped
  o(ctx, TrainingStage::DO_OPTIMIZER_STEP);
  EXPECT_FALSE(o.optimizer_step_skipped());
  EXPECT_EQ(clip->clip_count(), 1);
  EXPECT_DOUBLE_EQ(*clip->last_total_norm(), 50.0);
}

// ---------------------------------------------------------------- spike skipping

TEST(SpikeSkipping, LeavesNonFiniteGradientsToAnActiveGradScaler) {
  auto plugin = make_precision_plugin("16-mixed");
  at::Tensor p = at::zeros({1}, at::kFloat).requires_grad_(true);
  torch::optim::SGD sgd(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(1.0));
  plugin->pre_backward((p * 1.0f).sum()).backward();  // builds the scaler
  p.mutable_grad().fill_(std::numeric_limits<float>::infinity());
  SpikeSkippingHook h;
  TrainContext ctx;
  ctx.optimizers = {&sgd};
  ctx.loss = scalar(1.0);
  ctx.precision = plugin.get();
  EXPECT_TRUE(h(ctx, TrainingStage::DO_OPTIMIZER_STEP, false).proceed);  // the scaler skips it
  ctx.precision = nullptr;
  EXPECT_FALSE(h(ctx, TrainingStage::DO_OPTIMIZER_STEP, false).proceed);
  EXPECT_EQ(h.skipped_steps(), 1);
}

/// One optimizer-step cycle of `o` with `loss`; returns whether the step ran.
bool cycle(TrainingUpdateOrchestrator& o, TrainContext& ctx, double loss) {
  ctx.loss = scalar(loss);
  o(ctx, TrainingStage::DO_OPTIMIZER_STEP);
  o(ctx, TrainingStage::AFTER_OPTIMIZER_STEP);
  return !o.optimizer_step_skipped();
}

TEST(SpikeSkipping, NonFiniteLossAndGradientAreSkipped) {
  auto spike = std::make_shared<SpikeSkippingHook>();
  EXPECT_EQ(spike->priority(), update_priority::kSpikeSkipping);
  TrainingUpdateOrchestrator o({spike});
  TrainContext ctx;
  EXPECT_FALSE(cycle(o, ctx, kNaN));
  EXPECT_EQ(spike->skipped_steps(), 1);
  EXPECT_EQ(spike->last_skip_reason(), "non-finite loss");
  EXPECT_FALSE(cycle(o, ctx, kInf));
  EXPECT_EQ(spike->skipped_steps(), 2);

  Grads g({1.0, kInf, 0.0}, 0.0);
  ctx.optimizers = {&g.sgd};
  EXPECT_FALSE(cycle(o, ctx, 1.0));
  EXPECT_EQ(spike->skipped_steps(), 3);
  EXPECT_EQ(spike->last_skip_reason(), "non-finite gradient norm");
  EXPECT_TRUE(at::equal(g.p.detach(), at::zeros({3}, at::kDouble)));  // not stepped
  EXPECT_TRUE(spike->history().empty());                              // nothing accepted

  g.p.mutable_grad() = at::tensor({1.0, 2.0, 0.0}, at::kDouble);
  EXPECT_TRUE(cycle(o, ctx, 1.0));
  EXPECT_EQ(spike->skipped_steps(), 3);
  EXPECT_EQ(spike->history(), std::deque<double>{1.0});
}

TEST(SpikeSkipping, SpikeAfterStableHistoryIsSkippedAndCounted) {
  auto spike = std::make_shared<SpikeSkippingHook>(SpikeSkippingOptions{10.0, 50, 10});
  TrainingUpdateOrchestrator o({spike});
  TrainContext ctx;
  // Warm-up: a large loss passes while fewer than min_history losses are known.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(cycle(o, ctx, 1.0 + 0.01 * (i % 3)));
  EXPECT_TRUE(cycle(o, ctx, 50.0));
  EXPECT_FALSE(spike->threshold().has_value());
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(cycle(o, ctx, 1.0 + 0.01 * (i % 3)));
  // median 1.01, MAD 0.01 -> threshold 1.11
  ASSERT_TRUE(spike->threshold().has_value());
  EXPECT_NEAR(*spike->threshold(), 1.11, 1e-12);
  const size_t n = spike->history().size();
  EXPECT_FALSE(cycle(o, ctx, 100.0));
  EXPECT_EQ(spike->skipped_steps(), 1);
  EXPECT_EQ(spike->last_skip_reason(), "loss spike");
  EXPECT_EQ(spike->history().size(), n);  // the spike never enters the history
  EXPECT_TRUE(cycle(o, ctx, 1.05));       // normal steps pass
  EXPECT_EQ(spike->skipped_steps(), 1);
  EXPECT_EQ(spike->history().back(), 1.05);
  EXPECT_EQ(static_cast<int64_t>(spike->history().size()), 27);

  // A loss vetoed by an earlier hook is neither checked nor recorded.
  auto spike2 = std::make_shared<SpikeSkippingHook>(SpikeSkippingOptions{1e9, 3, 1});
  TrainingUpdateOrchestrator o2({spike2, step_vetoer(5)});
  EXPECT_FALSE(cycle(o2, ctx, kNaN));
  EXPECT_EQ(spike2->skipped_steps(), 0);
  EXPECT_TRUE(spike2->history().empty());
  // The window keeps the most recent accepted losses.
  TrainingUpdateOrchestrator o3({spike2});
  for (double l : {1.0, 2.0, 3.0, 4.0}) cycle(o3, ctx, l);
  EXPECT_EQ(spike2->history(), (std::deque<double>{2.0, 3.0, 4.0}));
}

TEST(SpikeSkipping, InvalidOptionsAreConfigErrors) {
  auto msg = [](SpikeSkippingOptions o) {
    try {
      SpikeSkippingHook h(o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg({0.0, 50, 10}), "`k` must be finite and > 0, got 0");
  EXPECT_EQ(msg({10.0, 0, 1}), "`window` must be >= 1, got 0");
  EXPECT_EQ(msg({10.0, 5, 6}), "`min_history` must be in [1, window] = [1, 5], got 6");
}

TEST(SpikeSkipping, SkippedStepLeavesStepCountAndParametersInTheStrategy) {
  auto spike = std::make_shared<SpikeSkippingHook>();
  // Poisons the gradients of the second batch (ctx.loss at the step is the
  // detached batch loss, so the gradient check is what vetoes).
  auto poison = std::make_shared<LambdaUpdateHook>(
      "poison",
      [](TrainContext& ctx, TrainingStage s, bool) {
        if (s == TrainingStage::DO_BACKWARD && ctx.batch_count == 1)
          return UpdateDecision{true, ctx.loss * kNaN};
        return UpdateDecision{true, ctx.loss};
      },
      1);
  ToyModel model;
  TrainingStrategy strategy(model.ptr(), steps_options(10), energy_loss(), {spike, poison});
  DataLoader loader(std::make_shared<AtomicDataset>(toy_structures(3, 3), 4.0),
                    {1, false, 0, false});
  strategy.train_batch(loader.batch(0));
  const auto after_first = params(model);
  strategy.train_batch(loader.batch(1));
  EXPECT_EQ(params(model), after_first);
  EXPECT_EQ(strategy.step_count, 1);
  EXPECT_EQ(strategy.batch_count, 2);
  EXPECT_EQ(spike->skipped_steps(), 1);
  strategy.train_batch(loader.batch(2));
  EXPECT_EQ(strategy.step_count, 2);
  EXPECT_NE(params(model), after_first);
  for (double v : params(model)) EXPECT_TRUE(std::isfinite(v));
}

// ---------------------------------------------------------------- EMA

/// A module with one parameter and one buffer.
struct Net : torch::nn::Module {
  at::Tensor w, n;
  explicit Net(double v) {
    w = register_parameter("w", at::full({2}, v, at::kDouble));
    n = register_buffer("n", at::full({1}, v, at::kDouble));
  }
  void set(double v) {
    at::NoGradGuard g;
    w.fill_(v);
    n.fill_(v);
  }
};

TEST(Ema, ShadowIsTheHandComputedAverage) {
  EmaHook h(EmaOptions{0.9, 1, 0});
  Net net(1.0);
  h.update(net);  // first update copies
  net.set(2.0);
  h.update(net);  // 0.9 * 1 + 0.1 * 2 = 1.1
  net.set(4.0);
  h.update(net);  // 0.9 * 1.1 + 0.1 * 4 = 1.39
  ASSERT_EQ(h.shadow_parameters().size(), 1u);
  EXPECT_EQ(h.shadow_parameters()[0].first, "w");
  EXPECT_TRUE(at::allclose(h.shadow_parameters()[0].second, at::full({2}, 1.39, at::kDouble),
                           0, 1e-14));
  EXPECT_EQ(h.num_updates(), 3);
  Net out(0.0);
  h.copy_to(out);
  EXPECT_NEAR(out.w[0].item<double>(), 1.39, 1e-14);
  EXPECT_EQ(out.n.item<double>(), 4.0);  // buffers are copied, not averaged
  // swap_into twice restores both.
  h.swap_into(net);
  EXPECT_NEAR(net.w[1].item<double>(), 1.39, 1e-14);
  EXPECT_NEAR(h.shadow_parameters()[0].second[1].item<double>(), 4.0, 0);
  h.swap_into(net);
  EXPECT_EQ(net.w[1].item<double>(), 4.0);
  EXPECT_NEAR(h.shadow_parameters()[0].second[1].item<double>(), 1.39, 1e-14);
}

TEST(Ema, SkippedStepsUpdateEveryAndStartStep) {
  EmaHook h(EmaOptions{0.5, 2, 3});
  auto model = ToyModel();
  TrainContext ctx;
  ctx.model = model.get();
  std::vector<int64_t> updated_at;
  for (int64_t s = 0; s < 7; ++s) {  // steps 1..7 (1-based)
    ctx.step_count = s;
    const int64_t before = h.num_updates();
    h(ctx, TrainingStage::AFTER_OPTIMIZER_STEP, /*will_skip=*/false);
    if (h.num_updates() > before) updated_at.push_back(s + 1);
  }
  EXPECT_EQ(updated_at, (std::vector<int64_t>{4, 6}));
  ctx.step_count = 7;  // step 8 would update, but it was skipped
  h(ctx, TrainingStage::AFTER_OPTIMIZER_STEP, /*will_skip=*/true);
  EXPECT_EQ(h.num_updates(), 2);
  for (TrainingStage s : {TrainingStage::SETUP, TrainingStage::BEFORE_BATCH,
                          TrainingStage::DO_OPTIMIZER_STEP})
    h(ctx, s, false);
  EXPECT_EQ(h.num_updates(), 2);
}

TEST(Ema, TracksTrainingInTheStrategyAndSkipsVetoedSteps) {
  ToyModel model;
  auto ema = std::make_shared<EmaHook>(EmaOptions{0.8, 1, 0});
  bool veto_next = false;
  auto vetoer = std::make_shared<LambdaUpdateHook>(
      "vetoer",
      [&veto_next](TrainContext& ctx, TrainingStage s, bool) {
        return UpdateDecision{!(s == TrainingStage::DO_OPTIMIZER_STEP && veto_next), ctx.loss};
      },
      5);
  TrainingStrategy strategy(model.ptr(), steps_options(10), energy_loss(), {ema, vetoer});
  DataLoader loader(std::make_shared<AtomicDataset>(toy_structures(4, 5), 4.0),
                    {1, false, 0, false});
  std::vector<double> expected;
  for (int64_t b = 0; b < 4; ++b) {
    veto_next = (b == 2);
    strategy.train_batch(loader.batch(b));
    if (veto_next) continue;
    const auto p = params(model);
    if (expected.empty()) {
      expected = p;
    } else {
      for (size_t i = 0; i < 3; ++i) expected[i] = 0.8 * expected[i] + 0.2 * p[i];
    }
  }
  EXPECT_EQ(ema->num_updates(), 3);
  EXPECT_EQ(strategy.step_count, 3);
  std::map<std::string, double> shadow;
  for (const auto& [n, t] : ema->shadow_parameters()) shadow[n] = t.item<double>();
  EXPECT_NEAR(shadow.at("a"), expected[0], 1e-14);
  EXPECT_NEAR(shadow.at("b"), expected[1], 1e-14);
  EXPECT_NEAR(shadow.at("c"), expected[2], 1e-14);
}

TEST(Ema, StateDictRoundTrip) {
  EmaHook h(EmaOptions{0.9, 1, 0});
  Net net(1.0);
  h.update(net);
  net.set(3.0);
  h.update(net);  // 1.2
  const auto state = h.state_dict();
  EXPECT_EQ(state.size(), 3u);  // w, n, num_updates
  EmaHook restored(EmaOptions{0.9, 1, 0});
  restored.load_state_dict(state);
  EXPECT_TRUE(restored.initialized());
  EXPECT_EQ(restored.num_updates(), 2);
  Net out(0.0);
  restored.copy_to(out);
  EXPECT_NEAR(out.w[0].item<double>(), 1.2, 1e-14);
  EXPECT_EQ(out.n.item<double>(), 3.0);
  // Continues averaging from the restored state.
  net.set(2.2);
  restored.update(net);
  h.update(net);
  EXPECT_TRUE(at::equal(restored.shadow_parameters()[0].second, h.shadow_parameters()[0].second));
  // Mismatching names are rejected.
  auto bad = state;
  bad["extra"] = at::zeros({1});
  EmaHook other;
  other.load_state_dict(bad);
  EXPECT_THROW(other.copy_to(out), std::invalid_argument);
  EXPECT_THROW(EmaHook().load_state_dict({}), std::invalid_argument);
  EXPECT_THROW(EmaHook().copy_to(out), std::logic_error);
  try {
    EmaHook e(EmaOptions{1.0, 1, 0});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "`decay` must be in [0, 1), got 1");
  }
}

}  // namespace
}  // namespace crucible
