// Exact continuation (issue 5 acceptance, in process): N+M steps in one go
// equal N steps, state_files(), a fresh strategy (new model object, other
// initial weights), restore_state_files() and M more steps: identical
// parameters and an identical loss history, bit for bit (CPU, 1 thread).
// Cases: 32-true; bf16-mixed; 16-mixed with a non-default scaler scale; EMA;
// gradient accumulation stopped mid-cycle; a stop in the middle of an epoch;
// reduce-on-plateau with accumulated patience; spike skipping history.

#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/schnet.h"
#include "crucible/training/ema.h"
#include "crucible/training/gradient_accumulation.h"
#include "crucible/training/mixed_precision_hook.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <c10/util/StringUtil.h>

#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace crucible {
namespace {

/// Adam's state of parameter `p` in `state` (Optimizer::state()). LibTorch
/// 1.13 keys it by the TensorImpl address printed as a string, 2.x by the
/// address itself.
template <class StateMap>
torch::optim::AdamParamState& adam_state(StateMap& state, const at::Tensor& p) {
  using Key = typename std::decay_t<StateMap>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    return static_cast<torch::optim::AdamParamState&>(*state.at(c10::str(p.unsafeGetTensorImpl())));
  } else {
    return static_cast<torch::optim::AdamParamState&>(*state.at(p.unsafeGetTensorImpl()));
  }
}

struct Case {
  std::string name;
  std::string precision = "32-true";
  int64_t accumulation = 1;
  bool ema = false;
  bool plateau = false;
  bool spike = false;
  double init_scale = 65536.0;
};

struct Data {
  std::shared_ptr<AtomicDataset> train, valid;
  Data() {
    auto all = read_extxyz(std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz");
    all.resize(14);
    std::vector<Structure> t(all.begin(), all.begin() + 10), v(all.begin() + 10, all.end());
    train = std::make_shared<AtomicDataset>(t, 4.0);
    valid = std::make_shared<AtomicDataset>(v, 4.0);
  }
};

/// A run of `c` with target `total` steps that stops after `stop_at` steps
/// (0 = never); records the loss of every batch.
struct ResumeRun {
  SchNet model{nullptr};
  std::unique_ptr<TrainingStrategy> strategy;
  std::vector<double> losses;

  ResumeRun(const Case& c, const Data& d, int64_t total, int64_t stop_at, uint64_t init_seed) {
    at::manual_seed(init_seed);
    SchNetOptions o;
    o.hidden_channels = 8;
    o.num_filters = 8;
    o.num_interactions = 1;
    o.num_gaussians = 6;
    o.cutoff = 4.0;
    model = SchNet(o);
    StrategyOptions so;
    so.num_steps = total;
    so.precision = c.precision;
    so.optimizer.lr = 5e-3;
    SchedulerConfig sc;
    if (c.plateau) {
      sc.name = "plateau";
      sc.plateau.patience = 3;
      sc.plateau.factor = 0.5;
      sc.plateau.threshold = 0.5;  // hardly any validation counts as better
    } else {
      sc.name = "cosine";
    }
    so.optimizer.scheduler = sc;
    ValidationConfig vc;
    vc.data = d.valid;
    vc.every_n_epochs = 0;
    vc.every_n_steps = c.plateau ? 1 : 0;
    so.validation = vc;
    WeightedSumLoss loss;
    loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
    loss.add(std::make_shared<ForcesMSELoss>(), 1.0);
    std::vector<std::shared_ptr<Hook>> hooks;
    if (c.precision == "16-mixed") {
      GradScalerOptions g;
      g.init_scale = c.init_scale;
      g.growth_interval = 2;  // the scale changes during the run
      hooks.push_back(std::make_shared<MixedPrecisionHook>("16-mixed", g));
    }
    if (c.accumulation > 1) hooks.push_back(std::make_shared<GradientAccumulationHook>(c.accumulation));
    if (c.ema) hooks.push_back(std::make_shared<EmaHook>(EmaOptions{0.7, 1, 0}));
    if (c.spike) {
      SpikeSkippingOptions sk;
      sk.k = 1.0;  // skips real steps
      sk.window = 8;
      sk.min_history = 3;
      hooks.push_back(std::make_shared<SpikeSkippingHook>(sk));
    }
    hooks.push_back(std::make_shared<LambdaHook>(
        "record", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
        [this, stop_at](TrainContext& ctx, TrainingStage) {
          losses.push_back(ctx.loss.item<double>());
          if (stop_at > 0 && ctx.batch_count == stop_at) ctx.strategy->request_stop();
        }));
    strategy = std::make_unique<TrainingStrategy>(model.ptr(), so, loss, hooks);
  }
};

DataLoader loader(const Data& d) { return DataLoader(d.train, DataLoaderOptions{3, true, 7, false}); }

void expect_exact_continuation(const Case& c, int64_t stop_batches) {
  SCOPED_TRACE(c.name);
  at::set_num_threads(1);
  Data d;
  const int64_t total = 9;  // optimizer steps
  ResumeRun full(c, d, total, 0, 1);
  auto l1 = loader(d);
  full.strategy->run(l1);

  ResumeRun first(c, d, total, stop_batches, 1);
  auto l2 = loader(d);
  first.strategy->run(l2);
  ASSERT_TRUE(first.strategy->stopped_early());
  ASSERT_EQ(first.strategy->batch_count, stop_batches);
  const auto files = first.strategy->state_files();

  ResumeRun resumed(c, d, total, 0, 99);  // other initial weights: all must come from the files
  std::map<std::string, std::string> by_name(files.begin(), files.end());
  resumed.strategy->restore_state_files(by_name);
  auto l3 = loader(d);
  resumed.strategy->run(l3);

  std::vector<double> history = first.losses;
  history.insert(history.end(), resumed.losses.begin(), resumed.losses.end());
  EXPECT_EQ(history, full.losses);
  EXPECT_EQ(resumed.strategy->step_count, full.strategy->step_count);
  EXPECT_EQ(resumed.strategy->batch_count, full.strategy->batch_count);
  auto a = full.model->named_parameters();
  auto b = resumed.model->named_parameters();
  for (const auto& item : a) {
    EXPECT_TRUE(item.value().equal(b[item.key()])) << item.key();
  }
  EXPECT_EQ(resumed.strategy->optimizers()[0]->param_groups()[0].options().get_lr(),
            full.strategy->optimizers()[0]->param_groups()[0].options().get_lr());
  ASSERT_TRUE(full.strategy->last_validation() && resumed.strategy->last_validation());
  EXPECT_EQ(resumed.strategy->last_validation()->forces_mae,
            full.strategy->last_validation()->forces_mae);
  // Issue 14: every checkpoint file of the resumed run equals the
  // uninterrupted run's (with EMA, rng.pt differed: the averaged copy drew
  // its initialisation from the global generator at the resume).
  const auto full_files = full.strategy->state_files();
  std::map<std::string, std::string> resumed_files;
  for (auto& [name, bytes] : resumed.strategy->state_files()) resumed_files[name] = bytes;
  EXPECT_EQ(full_files.size(), resumed_files.size());
  for (const auto& [name, bytes] : full_files) {
    ASSERT_EQ(resumed_files.count(name), 1u) << name;
    // LibTorch keys an optimizer archive by tensor addresses: its bytes
    // differ between two processes' objects; its state is compared below.
    if (name.rfind("optimizer.", 0) == 0 && name.find(".lr.") == std::string::npos) continue;
    EXPECT_TRUE(resumed_files.at(name) == bytes) << name << " differs";
  }
  auto* fa = full.strategy->optimizers().at(0);
  auto* ra = resumed.strategy->optimizers().at(0);
  const auto& fp = fa->param_groups().at(0).params();
  const auto& rp = ra->param_groups().at(0).params();
  ASSERT_EQ(fp.size(), rp.size());
  for (size_t i = 0; i < fp.size(); ++i) {
    auto& fs = adam_state(fa->state(), fp[i]);
    auto& rs = adam_state(ra->state(), rp[i]);
    EXPECT_EQ(fs.step(), rs.step()) << i;
    EXPECT_TRUE(fs.exp_avg().equal(rs.exp_avg())) << i;
    EXPECT_TRUE(fs.exp_avg_sq().equal(rs.exp_avg_sq())) << i;
  }
}

TEST(ExactResume, Fp32MidEpoch) { expect_exact_continuation({"32-true"}, 5); }

TEST(ExactResume, Bf16Mixed) {
  Case c{"bf16-mixed"};
  c.precision = "bf16-mixed";
  expect_exact_continuation(c, 4);
}

TEST(ExactResume, SixteenMixedWithNonDefaultScale) {
  Case c{"16-mixed"};
  c.precision = "16-mixed";
  c.init_scale = 1024.0;
  expect_exact_continuation(c, 5);
}

TEST(ExactResume, Ema) {
  Case c{"ema"};
  c.ema = true;
  expect_exact_continuation(c, 4);
}

TEST(ExactResume, GradientAccumulationStoppedMidCycle) {
  Case c{"accumulation"};
  c.accumulation = 3;
  expect_exact_continuation(c, 7);  // 7 = 2 full cycles + 1 batch of the third
}

TEST(ExactResume, PlateauWithAccumulatedPatience) {
  Case c{"plateau"};
  c.plateau = true;
  expect_exact_continuation(c, 5);
}

TEST(ExactResume, SpikeSkippingHistory) {
  Case c{"spike"};
  c.spike = true;
  expect_exact_continuation(c, 6);
}

TEST(ExactResume, MismatchedHooksAreRejectedNamingTheFile) {
  Data d;
  Case with_ema{"ema"};
  with_ema.ema = true;
  ResumeRun first(with_ema, d, 4, 2, 1);
  auto l = loader(d);
  first.strategy->run(l);
  const auto files = first.strategy->state_files();
  std::map<std::string, std::string> by_name(files.begin(), files.end());
  Case plain{"plain"};
  ResumeRun other(plain, d, 4, 0, 1);
  try {
    other.strategy->restore_state_files(by_name);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("hooks.pt: holds the state of hook 'EmaHook', which "
                                         "this run does not register"),
              std::string::npos)
        << e.what();
  }
  by_name.erase("rng.pt");
  ResumeRun same(with_ema, d, 4, 0, 1);
  try {
    same.strategy->restore_state_files(by_name);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_STREQ(e.what(), "rng.pt: the checkpoint must contain it, got no such file");
  }
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// Issue 15: a run killed after its last step but before the end stage
// (AFTER_TRAINING, the final validation, the end checkpoint) resumes into
// that stage once, and a run resumed after the end stage does not repeat
// it. (checkpoint_sigkill found a killed run without the final validation
// line that the uninterrupted run's metrics.jsonl has.)
TEST(ExactResume, AfterTheLastStepTheEndStageRunsOnce) {
  at::set_num_threads(1);
  Data d;
  const int64_t total = 9;
  int ends = 0;
  std::vector<std::pair<std::string, std::string>> before_end;
  auto count_ends = [&](ResumeRun& r, bool capture) {
    r.strategy->register_hook(std::make_shared<LambdaHook>(
        "count_ends", std::set<TrainingStage>{TrainingStage::AFTER_TRAINING},
        [&, capture](TrainContext& ctx, TrainingStage) {
          ++ends;
          if (capture) before_end = ctx.strategy->state_files();  // as the last epoch's checkpoint
        }));
  };
  ResumeRun full(Case{"end"}, d, total, 0, 1);
  count_ends(full, true);
  auto l1 = loader(d);
  full.strategy->run(l1);
  ASSERT_EQ(ends, 1);
  ASSERT_TRUE(full.strategy->last_validation());
  ASSERT_FALSE(before_end.empty());

  ResumeRun resumed(Case{"end"}, d, total, 0, 99);
  count_ends(resumed, false);
  resumed.strategy->restore_state_files(std::map<std::string, std::string>(before_end.begin(), before_end.end()));
  ASSERT_FALSE(resumed.strategy->last_validation());
  auto l2 = loader(d);
  resumed.strategy->run(l2);
  EXPECT_EQ(ends, 2) << "the resumed run must run the end stage";
  EXPECT_TRUE(resumed.losses.empty()) << "no step is left";
  ASSERT_TRUE(resumed.strategy->last_validation());
  EXPECT_EQ(resumed.strategy->last_validation()->forces_mae, full.strategy->last_validation()->forces_mae);
  EXPECT_EQ(resumed.strategy->step_count, total);

  // Its state now records the end stage: a further resume does not repeat it.
  const auto after_end = resumed.strategy->state_files();
  ResumeRun again(Case{"end"}, d, total, 0, 5);
  count_ends(again, false);
  again.strategy->restore_state_files(std::map<std::string, std::string>(after_end.begin(), after_end.end()));
  auto l3 = loader(d);
  again.strategy->run(l3);
  EXPECT_EQ(ends, 2) << "the end stage ran again after a resume past it";
}

}  // namespace
}  // namespace crucible
