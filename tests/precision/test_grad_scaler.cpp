// GradScaler: PyTorch GradScaler semantics (scale, unscale, skipped steps,
// growth/backoff, state dict), cross-checked against PyTorch's own GradScaler
// bookkeeping via tests/precision/oracles/grad_scaler_oracle.py.

#include "common/python_oracle.h"
#include "crucible/common/error.h"
#include "crucible/precision/grad_scaler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::python_has;
using testing::run_python;

/// One parameter vector and an SGD optimizer (lr 0.1) over it.
struct Toy {
  at::Tensor w;
  std::unique_ptr<torch::optim::SGD> opt;
  explicit Toy(std::vector<float> init = {1.0f, -2.0f, 3.0f}) {
    w = at::tensor(init, at::kFloat).set_requires_grad(true);
    opt = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{w},
                                              torch::optim::SGDOptions(0.1));
  }
  void set_grad(const at::Tensor& g) { w.mutable_grad() = g.clone(); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

TEST(GradScalerOptions, DefaultsArePyTorchs) {
  GradScalerOptions o;
  EXPECT_EQ(o.init_scale, 65536.0);
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_TRUE(o.enabled);
  GradScaler s;
  EXPECT_TRUE(s.is_enabled());
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.get_growth_tracker(), 0);
}

TEST(GradScalerOptions, ValidationNamesOptionAndValue) {
  auto make = [](auto edit) {
    return error_of([&] {
      GradScalerOptions o;
      edit(o);
      GradScaler s(o);
    });
  };
  EXPECT_EQ(make([](GradScalerOptions& o) { o.growth_factor = 0.5; }),
            "growth_factor must be > 1, got 0.5");
  EXPECT_EQ(make([](GradScalerOptions& o) { o.growth_factor = 1.0; }),
            "growth_factor must be > 1, got 1");
  EXPECT_EQ(make([](GradScalerOptions& o) { o.backoff_factor = 1.5; }),
            "backoff_factor must be in (0, 1), got 1.5");
  EXPECT_EQ(make([](GradScalerOptions& o) { o.backoff_factor = 0.0; }),
            "backoff_factor must be in (0, 1), got 0");
  EXPECT_EQ(make([](GradScalerOptions& o) { o.init_scale = -1.0; }),
            "init_scale must be finite and > 0, got -1");
  EXPECT_EQ(make([](GradScalerOptions& o) { o.init_scale = std::numeric_limits<double>::infinity(); }),
            "init_scale must be finite and > 0, got inf");
  EXPECT_EQ(make([](GradScalerOptions& o) { o.growth_interval = 0; }),
            "growth_interval must be >= 1, got 0");
  GradScalerOptions bad;
  bad.growth_factor = 0.5;
  EXPECT_THROW(GradScaler{bad}, ConfigError);
}

TEST(GradScaler, ScaleMultipliesBy65536ByDefault) {
  GradScaler s;
  const at::Tensor loss = at::scalar_tensor(1.5, at::kFloat);
  const at::Tensor scaled = s.scale(loss);
  EXPECT_EQ(scaled.dim(), 0);
  EXPECT_EQ(scaled.scalar_type(), at::kFloat);
  EXPECT_EQ(scaled.item<float>(), 1.5f * 65536.0f);
  // fp16 / bf16 losses are scaled in float32 (65504 * 65536 would overflow fp16).
  const at::Tensor half = s.scale(at::tensor({65504.0}).to(at::kHalf));
  EXPECT_EQ(half.scalar_type(), at::kFloat);
  EXPECT_EQ(half.sizes().vec(), std::vector<int64_t>{1});
  EXPECT_EQ(half.item<float>(), 65504.0f * 65536.0f);
  EXPECT_EQ(s.scale(at::ones({2}, at::kBFloat16)).scalar_type(), at::kFloat);
  // float64 stays float64.
  EXPECT_EQ(s.scale(at::scalar_tensor(0.25, at::kDouble)).scalar_type(), at::kDouble);
  EXPECT_THROW(s.scale(at::ones({1}, at::kLong)), std::invalid_argument);
}

TEST(GradScaler, ScaledBackwardThenUnscaleRecoversGradientsExactly) {
  Toy t;
  GradScaler s;
  const at::Tensor x = at::tensor({0.3f, -1.7f, 2.9f});
  s.scale((t.w * x).sum()).backward();
  EXPECT_TRUE(at::equal(t.w.grad(), x * 65536.0f));
  s.unscale(*t.opt);
  EXPECT_TRUE(at::equal(t.w.grad(), x));  // power-of-two scale: exact
  EXPECT_EQ(s.found_inf(*t.opt), std::optional<bool>(false));
}

TEST(GradScaler, UnscaleDividesGradsInPlaceWithNonPowerOfTwoScale) {
  GradScalerOptions o;
  o.init_scale = 3.0;
  GradScaler s(o);
  Toy t;
  s.scale(at::tensor(1.0f));
  const at::Tensor g = at::tensor({3.0f, 6.0f, 1.0f});
  t.set_grad(g);
  const at::Tensor grad_before = t.w.grad();
  s.unscale(*t.opt);
  EXPECT_TRUE(t.w.grad().is_same(grad_before));  // in place
  const float inv = static_cast<float>(1.0 / 3.0);  // PyTorch: reciprocal in FP64, then FP32
  EXPECT_TRUE(at::equal(t.w.grad(), g * inv));
}

TEST(GradScaler, SecondUnscaleBeforeUpdateThrows) {
  GradScaler s;
  Toy t;
  s.scale(at::tensor(1.0f));
  t.set_grad(at::ones({3}));
  s.unscale(*t.opt);
  EXPECT_EQ(error_of([&] { s.unscale(*t.opt); }),
            "unscale() has already been called on this optimizer since the last update()");
  EXPECT_THROW(s.unscale(*t.opt), std::logic_error);
  // step() after an explicit unscale() does not unscale again.
  EXPECT_TRUE(s.step(*t.opt));
  EXPECT_TRUE(at::allclose(t.w, at::tensor({1.0f, -2.0f, 3.0f}) - 0.1f / 65536.0f));
  EXPECT_EQ(error_of([&] { s.step(*t.opt); }),
            "step() has already been called on this optimizer since the last update()");
  EXPECT_EQ(error_of([&] { s.unscale(*t.opt); }), "unscale() is being called after step()");
  s.update();
  // After update() the optimizer is ready again.
  t.set_grad(at::ones({3}));
  EXPECT_NO_THROW(s.unscale(*t.opt));
}

TEST(GradScaler, MethodsBeforeScaleThrow) {
  GradScaler s;
  Toy t;
  t.set_grad(at::ones({3}));
  EXPECT_THROW(s.unscale(*t.opt), std::logic_error);
  EXPECT_THROW(s.step(*t.opt), std::logic_error);
  EXPECT_THROW(s.update(), std::logic_error);
  s.scale(at::tensor(1.0f));
  EXPECT_EQ(error_of([&] { s.update(); }), "No inf checks were recorded prior to update()");
}

TEST(GradScaler, LowPrecisionGradsUnscaledInFloat32) {
  GradScalerOptions o;
  o.init_scale = 3.0;
  GradScaler s(o);
  s.scale(at::tensor(1.0f));
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    auto w = at::zeros({4}, dtype).set_requires_grad(true);
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
    const at::Tensor g = at::tensor({3.0, 7.0, 1000.0, 0.01}).to(dtype);
    w.mutable_grad() = g.clone();
    s.unscale(opt);
    EXPECT_EQ(w.grad().scalar_type(), dtype);
    const at::Tensor expected = (g.to(at::kFloat) * static_cast<float>(1.0 / 3.0)).to(dtype);
    EXPECT_TRUE(at::equal(w.grad(), expected)) << dtype;
    s.update();
    s.scale(at::tensor(1.0f));
  }
}

TEST(GradScaler, InfGradientSkipsStepAndBacksOff) {
  GradScaler s;
  Toy t;
  const at::Tensor w0 = t.w.detach().clone();
  s.scale(at::tensor(1.0f));
  t.set_grad(at::tensor({1.0f, std::numeric_limits<float>::infinity(), 2.0f}));
  EXPECT_FALSE(s.step(*t.opt));
  EXPECT_TRUE(at::equal(t.w.detach(), w0));
  EXPECT_EQ(s.found_inf(*t.opt), std::optional<bool>(true));
  s.update();
  EXPECT_EQ(s.get_scale(), 32768.0);
  EXPECT_EQ(s.get_growth_tracker(), 0);
  EXPECT_EQ(s.found_inf(*t.opt), std::nullopt);  // cleared by update()
}

TEST(GradScaler, NaNGradientSkipsStepAndBacksOff) {
  GradScaler s;
  Toy t;
  const at::Tensor w0 = t.w.detach().clone();
  s.scale(at::tensor(1.0f));
  t.set_grad(at::tensor({std::nanf(""), 0.0f, 2.0f}));
  EXPECT_FALSE(s.step(*t.opt));
  EXPECT_TRUE(at::equal(t.w.detach(), w0));
  s.update();
  EXPECT_EQ(s.get_scale(), 32768.0);
  // A clean step afterwards runs.
  t.set_grad(at::ones({3}));
  EXPECT_TRUE(s.step(*t.opt));
  EXPECT_FALSE(at::equal(t.w.detach(), w0));
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanSteps) {
  GradScalerOptions o;
  o.growth_interval = 3;
  GradScaler s(o);
  Toy t;
  s.scale(at::tensor(1.0f));
  const std::vector<double> expected_scale = {65536, 65536, 131072, 131072, 131072, 262144};
  const std::vector<int64_t> expected_tracker = {1, 2, 0, 1, 2, 0};
  for (size_t i = 0; i < expected_scale.size(); ++i) {
    t.set_grad(at::ones({3}));
    EXPECT_TRUE(s.step(*t.opt));
    s.update();
    EXPECT_EQ(s.get_scale(), expected_scale[i]) << "iteration " << i;
    EXPECT_EQ(s.get_growth_tracker(), expected_tracker[i]) << "iteration " << i;
  }
}

TEST(GradScaler, HandComputedSequenceOfFoundInfFlags) {
  GradScalerOptions o;
  o.growth_interval = 3;
  GradScaler s(o);
  Toy t;
  s.scale(at::tensor(1.0f));
  const std::string flags = "0010001000011";
  const std::vector<double> expected = {65536, 65536, 32768, 32768, 32768, 65536, 32768,
                                        32768, 32768, 65536, 65536, 32768, 16384};
  for (size_t i = 0; i < flags.size(); ++i) {
    const float v = flags[i] == '1' ? std::numeric_limits<float>::infinity() : 1.0f;
    t.set_grad(at::full({3}, v));
    EXPECT_EQ(s.step(*t.opt), flags[i] == '0');
    s.update();
    EXPECT_EQ(s.get_scale(), expected[i]) << "iteration " << i;
  }
}

TEST(GradScaler, DoesNotGrowPastFloat32Max) {
  GradScalerOptions o;
  o.init_scale = 3e38;
  o.growth_interval = 1;
  GradScaler s(o);
  Toy t;
  s.scale(at::tensor(1e-38f));
  t.set_grad(at::ones({3}));
  s.step(*t.opt);
  s.update();
  EXPECT_EQ(s.get_scale(), static_cast<double>(3e38f));
  EXPECT_EQ(s.get_growth_tracker(), 0);
}

TEST(GradScaler, UndefinedAndSparseGrads) {
  GradScaler s;
  s.scale(at::tensor(1.0f));
  auto dense = at::zeros({2}).set_requires_grad(true);
  auto no_grad = at::zeros({2}).set_requires_grad(true);
  auto sparse = at::zeros({4, 2}).set_requires_grad(true);
  torch::optim::SGD opt({dense, no_grad, sparse}, torch::optim::SGDOptions(0.1));
  dense.mutable_grad() = at::full({2}, 65536.0f);
  const at::Tensor idx = at::tensor({0, 2, 0}, at::kLong).reshape({1, 3});
  const at::Tensor vals = at::full({3, 2}, 131072.0f);
  sparse.mutable_grad() = at::sparse_coo_tensor(idx, vals, {4, 2});
  s.unscale(opt);
  EXPECT_FALSE(no_grad.grad().defined());
  EXPECT_TRUE(at::equal(dense.grad(), at::ones({2})));
  EXPECT_TRUE(sparse.grad().is_sparse());
  const at::Tensor expected = at::tensor({4.0f, 4.0f, 0.0f, 0.0f, 2.0f, 2.0f, 0.0f, 0.0f}).reshape({4, 2});
  EXPECT_TRUE(at::equal(sparse.grad().to_dense(), expected));
  EXPECT_EQ(s.found_inf(opt), std::optional<bool>(false));

  // An optimizer without any gradient has no inf check to step on.
  auto lone = at::zeros({2}).set_requires_grad(true);
  torch::optim::SGD empty_opt({lone}, torch::optim::SGDOptions(0.1));
  EXPECT_THROW(s.step(empty_opt), std::logic_error);
}

TEST(GradScaler, AnyOptimizerWithInfBacksOffAndOnlyItsStepIsSkipped) {
  GradScaler s;
  Toy a, b;
  const at::Tensor b0 = b.w.detach().clone();
  s.scale(at::tensor(1.0f));
  a.set_grad(at::ones({3}));
  b.set_grad(at::full({3}, std::numeric_limits<float>::infinity()));
  EXPECT_TRUE(s.step(*a.opt));
  EXPECT_FALSE(s.step(*b.opt));
  EXPECT_TRUE(at::equal(b.w.detach(), b0));
  EXPECT_EQ(s.found_inf(*a.opt), std::optional<bool>(false));
  EXPECT_EQ(s.found_inf(*b.opt), std::optional<bool>(true));
  s.update();
  EXPECT_EQ(s.get_scale(), 32768.0);
}

// ---- oracle ------------------------------------------------------------------



struct Trace {
  std::vector<float> scale;
  std::vector<int64_t> tracker;
};

/// Runs the C++ scaler over `iterations` (comma-separated; one char per
/// optimizer, '1' = inf gradient), resuming from state_dict() into a fresh
/// scaler (default options) before iteration `resume_at` when >= 0.
Trace run_cpp(const GradScalerOptions& o, const std::vector<std::string>& iterations,
              int resume_at) {
  Trace tr;
  auto scaler = std::make_unique<GradScaler>(o);
  const size_t n_opt = iterations.front().size();
  std::vector<std::unique_ptr<Toy>> toys;
  for (size_t k = 0; k < n_opt; ++k) toys.push_back(std::make_unique<Toy>());
  for (size_t i = 0; i < iterations.size(); ++i) {
    if (static_cast<int>(i) == resume_at) {
      const auto state = scaler->state_dict();
      scaler = std::make_unique<GradScaler>();
      scaler->load_state_dict(state);
    }
    scaler->scale(at::tensor(1.0f));
    for (size_t k = 0; k < n_opt; ++k) {
      const bool bad = iterations[i][k] == '1';
      toys[k]->set_grad(at::full({3}, bad ? std::nanf("") : 1.0f));
      EXPECT_EQ(scaler->step(*toys[k]->opt), !bad);
    }
    scaler->update();
    tr.scale.push_back(static_cast<float>(scaler->get_scale()));
    tr.tracker.push_back(scaler->get_growth_tracker());
  }
  return tr;
}

struct OracleCase {
  GradScalerOptions o;
  std::vector<std::string> iterations;
  int resume_at;
};

/// One python process for all cases (importing torch costs ~2 s).
std::vector<Trace> run_oracle(const std::vector<OracleCase>& cases) {
  std::ostringstream args;
  args.precision(17);
  args << CRUCIBLE_SOURCE_DIR << "/tests/precision/oracles/grad_scaler_oracle.py";
  for (const auto& c : cases) {
    args << " " << c.o.init_scale << ":" << c.o.growth_factor << ":" << c.o.backoff_factor << ":"
         << c.o.growth_interval << ":";
    for (size_t i = 0; i < c.iterations.size(); ++i) args << (i ? "," : "") << c.iterations[i];
    args << ":" << c.resume_at;
  }
  std::istringstream in(run_python(args.str()));
  std::vector<Trace> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    Trace tr;
    double scale;
    int64_t tracker;
    while (ls >> scale >> tracker) {
      tr.scale.push_back(static_cast<float>(scale));
      tr.tracker.push_back(tracker);
    }
    out.push_back(tr);
  }
  return out;
}

std::vector<std::string> pseudo_random_flags(size_t n, size_t n_opt, unsigned seed, int one_in) {
  std::vector<std::string> out;
  unsigned x = seed;
  for (size_t i = 0; i < n; ++i) {
    std::string it;
    for (size_t k = 0; k < n_opt; ++k) {
      x = x * 1103515245u + 12345u;
      it.push_back(((x >> 16) % one_in) == 0 ? '1' : '0');
    }
    out.push_back(it);
  }
  return out;
}

TEST(GradScalerOracle, ScaleSequenceMatchesPyTorchGradScaler) {
  if (!python_has("torch")) GTEST_SKIP() << "torch unavailable at " << CRUCIBLE_PYTHON;
  std::vector<OracleCase> cases;
  {
    GradScalerOptions o;
    o.growth_interval = 3;
    cases.push_back({o, pseudo_random_flags(60, 1, 7u, 5), -1});
    cases.push_back({o, pseudo_random_flags(60, 1, 7u, 5), 23});
  }
  {
    GradScalerOptions o;  // non-power-of-two factors: float32 rounding matters
    o.init_scale = 7.0;
    o.growth_factor = 3.0;
    o.backoff_factor = 0.3;
    o.growth_interval = 2;
    cases.push_back({o, pseudo_random_flags(80, 2, 11u, 6), -1});
    cases.push_back({o, pseudo_random_flags(80, 2, 11u, 6), 41});
  }
  {
    GradScalerOptions o;  // growth capped at float32 max
    o.init_scale = 1e38;
    o.growth_factor = 4.0;
    o.growth_interval = 1;
    cases.push_back({o, {"0", "0", "0", "1", "0", "0", "0"}, -1});
  }
  const std::vector<Trace> oracle = run_oracle(cases);
  ASSERT_EQ(oracle.size(), cases.size()) << "oracle failed";
  for (size_t c = 0; c < cases.size(); ++c) {
    const Trace& want = oracle[c];
    ASSERT_EQ(want.scale.size(), cases[c].iterations.size()) << "oracle failed, case " << c;
    const Trace got = run_cpp(cases[c].o, cases[c].iterations, cases[c].resume_at);
    for (size_t i = 0; i < want.scale.size(); ++i) {
      EXPECT_EQ(got.scale[i], want.scale[i]) << "case " << c << " iteration " << i;
      EXPECT_EQ(got.tracker[i], want.tracker[i]) << "case " << c << " iteration " << i;
    }
  }
}

// ---- state dict / disabled ---------------------------------------------------

TEST(GradScaler, StateDictHasPyTorchKeys) {
  GradScalerOptions o;
  o.growth_interval = 5;
  GradScaler s(o);
  Toy t;
  s.scale(at::tensor(1.0f));
  t.set_grad(at::ones({3}));
  s.step(*t.opt);
  s.update();
  const auto sd = s.state_dict();
  const std::map<std::string, double> expected = {{"scale", 65536.0},
                                                  {"growth_factor", 2.0},
                                                  {"backoff_factor", 0.5},
                                                  {"growth_interval", 5.0},
                                                  {"_growth_tracker", 1.0}};
  EXPECT_EQ(sd, expected);
}

TEST(GradScaler, StateDictRoundTripResumesIdentically) {
  GradScalerOptions o;
  o.growth_interval = 4;
  o.growth_factor = 3.0;
  o.backoff_factor = 0.25;
  const std::string flags = "00100000100000000";
  auto drive = [&](GradScaler& s, Toy& t, size_t from, size_t to, std::vector<double>* out) {
    for (size_t i = from; i < to; ++i) {
      s.scale(at::tensor(1.0f));
      t.set_grad(at::full({3}, flags[i] == '1' ? std::numeric_limits<float>::infinity() : 1.0f));
      s.step(*t.opt);
      s.update();
      out->push_back(s.get_scale());
    }
  };
  GradScaler reference(o);
  Toy t_ref;
  std::vector<double> ref;
  drive(reference, t_ref, 0, flags.size(), &ref);

  GradScaler first(o);
  Toy t1;
  std::vector<double> got;
  drive(first, t1, 0, 6, &got);
  const auto sd = first.state_dict();
  EXPECT_EQ(sd.at("_growth_tracker"), 3.0);  // "001000": three clean steps since the backoff

  GradScaler before_scale;  // default options; load before the lazy init
  before_scale.load_state_dict(sd);
  EXPECT_EQ(before_scale.get_scale(), sd.at("scale"));
  EXPECT_EQ(before_scale.get_growth_tracker(), 3);
  EXPECT_EQ(before_scale.get_growth_interval(), 4);
  EXPECT_EQ(before_scale.state_dict(), sd);
  drive(before_scale, t1, 6, flags.size(), &got);
  EXPECT_EQ(got, ref);

  // Loading into an already-initialised scaler overwrites its tensors.
  GradScaler after_scale;
  after_scale.scale(at::tensor(1.0f));
  after_scale.load_state_dict(sd);
  EXPECT_EQ(after_scale.state_dict(), sd);

  GradScaler bad;
  EXPECT_THROW(bad.load_state_dict({}), std::invalid_argument);
  auto missing = sd;
  missing.erase("_growth_tracker");
  EXPECT_EQ(error_of([&] { bad.load_state_dict(missing); }),
            "GradScaler state dict lacks \"_growth_tracker\"");
  auto wrong = sd;
  wrong["backoff_factor"] = 2.0;
  EXPECT_THROW(bad.load_state_dict(wrong), ConfigError);
}

TEST(GradScaler, DisabledScalerIsIdentity) {
  GradScalerOptions o;
  o.enabled = false;
  GradScaler s(o);
  EXPECT_FALSE(s.is_enabled());
  const at::Tensor loss = at::tensor(2.5f);
  EXPECT_TRUE(s.scale(loss).is_same(loss));
  EXPECT_EQ(s.get_scale(), 1.0);
  Toy t;
  t.set_grad(at::ones({3}) * 10.0f);
  s.unscale(*t.opt);  // no-op
  EXPECT_TRUE(at::equal(t.w.grad(), at::ones({3}) * 10.0f));
  EXPECT_TRUE(s.step(*t.opt));  // just steps
  EXPECT_TRUE(at::allclose(t.w.detach(), at::tensor({0.0f, -3.0f, 2.0f}), 1e-6, 1e-6)) << t.w;
  s.update();
  EXPECT_EQ(s.get_scale(), 1.0);
  EXPECT_TRUE(s.state_dict().empty());
  EXPECT_EQ(s.found_inf(*t.opt), std::nullopt);
  EXPECT_NO_THROW(s.load_state_dict({}));
}

TEST(GradScaler, UpdateWithExplicitScale) {
  GradScaler s;
  Toy t;
  s.scale(at::tensor(1.0f));
  t.set_grad(at::ones({3}));
  s.step(*t.opt);
  s.update(1024.0);
  EXPECT_EQ(s.get_scale(), 1024.0);
  EXPECT_EQ(s.scale(at::tensor(2.0f)).item<float>(), 2048.0f);
  EXPECT_THROW(s.update(0.0), std::invalid_argument);
}

}  // namespace
}  // namespace crucible
