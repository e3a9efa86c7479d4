// Issue 6: DataParallelHook inside real strategies on two threads joined by
// a Gloo process group: identical start, gradients averaged exactly as one
// worker on the union batch, and one worker's inf gradient skips the step
// on every worker.

#include "crucible/distributed/launcher.h"
#include "crucible/distributed/process_group.h"
#include "crucible/training/checkpointing.h"
#include "crucible/training/data_parallel.h"
#include "crucible/training/spike_skipping.h"
#include "crucible/training/strategy.h"
#include "training/toy_model.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::ToyModel;

std::shared_ptr<Communicator> connect(int rank, int size, int port) {
  DistributedEnv env;
  env.rank = rank;
  env.world_size = size;
  env.master_port = port;
  ProcessGroupOptions o;
  o.timeout = std::chrono::seconds(30);
  return make_process_group(env, o);
}

/// Equal-size structures (3 atoms each): per-batch means then average
/// exactly like one batch of the union.
std::shared_ptr<AtomicDataset> trimers(int n) {
  auto v = testing::toy_structures(10 * n, 5);
  std::vector<Structure> out;
  for (auto& s : v) {
    if (s.num_atoms() == 3 && static_cast<int>(out.size()) < n) out.push_back(s);
  }
  return std::make_shared<AtomicDataset>(out, 4.0);
}

StrategyOptions sgd_options(int64_t steps) {
  StrategyOptions o;
  o.num_steps = steps;
  o.dtype = at::kDouble;
  o.optimizer.name = "adam";
  o.optimizer.lr = 0.05;
  return o;
}

TEST(DataParallel, TwoWorkersWithBatchBEqualOneWorkerWithBatch2B) {
  auto data = trimers(16);
  ASSERT_EQ(data->size(), 16);
  // One worker, batch 4.
  ToyModel single(0.5, 1.0, 0.0);
  {
    TrainingStrategy s(single.ptr(), sgd_options(10), energy_forces_loss());
    DataLoader loader(data, {4, true, 3, false});
    s.run(loader);
  }
  // Two workers, batch 2 each; rank 1 starts from other parameters
  // (the SETUP broadcast must make them rank 0's).
  const int port = free_local_port();
  std::vector<ToyModel> models{ToyModel(0.5, 1.0, 0.0), ToyModel(3.0, 0.2, 1.0)};
  std::vector<int64_t> global_steps(2), reduces(2);
  auto worker = [&](int rank) {
    auto o = sgd_options(10);
    o.communicator = connect(rank, 2, port);
    TrainingStrategy s(models[rank].ptr(), o, energy_forces_loss());
    DataLoaderOptions lo{2, true, 3, false};
    lo.num_replicas = 2;
    lo.rank = rank;
    DataLoader loader(data, lo);
    s.run(loader);
    global_steps[rank] = s.global_step_count;
    for (const auto& h : s.registered_hooks()) {
      if (auto* dp = dynamic_cast<DataParallelHook*>(h.get())) reduces[rank] = dp->num_reduced_steps();
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(models[r]->a.item<double>(), single->a.item<double>(), 1e-9) << "rank " << r;
    EXPECT_NEAR(models[r]->b.item<double>(), single->b.item<double>(), 1e-9) << "rank " << r;
    EXPECT_NEAR(models[r]->c.item<double>(), single->c.item<double>(), 1e-9) << "rank " << r;
    EXPECT_EQ(global_steps[r], 20) << "global_step_count advances by the world size";
    EXPECT_EQ(reduces[r], 10);
  }
  EXPECT_NE(single->a.item<double>(), 0.5) << "training moved the parameters";
}

TEST(DataParallel, AnInfGradientOnOneWorkerSkipsTheStepOnEvery) {
  auto data = trimers(16);
  const int port = free_local_port();
  std::vector<ToyModel> models{ToyModel(0.5, 1.0, 0.0), ToyModel(0.5, 1.0, 0.0)};
  std::vector<int64_t> skipped(2), steps(2);
  auto worker = [&](int rank) {
    auto o = sgd_options(8);
    o.communicator = connect(rank, 2, port);
    TrainingStrategy s(models[rank].ptr(), o, energy_forces_loss());
    SpikeSkippingOptions so;
    so.min_history = 1;
    so.k = 1e6;  // only non-finite values are skipped
    auto spike = std::make_shared<SpikeSkippingHook>(so);
    s.register_hook(spike);
    if (rank == 1) {  // rank 1 alone: an inf gradient on its 3rd batch, before the reduce
      s.register_hook(std::make_shared<LambdaUpdateHook>(
          "plant inf", [](TrainContext& ctx, TrainingStage stage, bool) {
            if (stage == TrainingStage::DO_OPTIMIZER_STEP && ctx.batch_count == 2) {
              ctx.model->module().parameters()[0].mutable_grad().fill_(
                  std::numeric_limits<double>::infinity());
            }
            return UpdateDecision{true, ctx.loss};
          },
          /*priority=*/12));
    }
    DataLoaderOptions lo{2, true, 3, false};
    lo.num_replicas = 2;
    lo.rank = rank;
    DataLoader loader(data, lo);
    s.run(loader);
    skipped[rank] = spike->skipped_steps();
    steps[rank] = s.step_count;
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ(skipped[0], 1);
  EXPECT_EQ(skipped[1], 1);
  EXPECT_EQ(steps[0], steps[1]);
  EXPECT_TRUE(models[0]->a.equal(models[1]->a));
  EXPECT_TRUE(std::isfinite(models[0]->a.item<double>()));
}

// Issue 14: with mixed labels, one worker's batches may hold no stress
// label while the other's do; both train (the stress term is 0 there and its
// missing prediction no error), average the same gradients and stay equal.
TEST(DataParallel, WorkersWithAndWithoutStressLabelsTrainTogether) {
  // Even indices periodic with stress, odd molecules: without shuffling,
  // rank 0 takes every periodic frame and rank 1 every molecule.
  auto data = std::make_shared<AtomicDataset>(testing::mixed_stress_structures(8), 4.0);
  const int port = free_local_port();
  std::vector<ToyModel> models{ToyModel(0.5, 1.0, 0.0), ToyModel(0.5, 1.0, 0.0)};
  std::vector<int64_t> steps(2);
  std::vector<std::string> reasons(2);
  std::vector<int64_t> stress_labelled(2);
  auto worker = [&](int rank) {
    auto o = sgd_options(4);
    o.communicator = connect(rank, 2, port);
    TrainingStrategy s(models[rank].ptr(), o, testing::energy_forces_stress_loss());
    s.register_hook(std::make_shared<LambdaHook>(
        "count", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH},
        [&, rank](TrainContext& ctx, TrainingStage) {
          stress_labelled[rank] += ctx.batch->has_stress.sum().item<int64_t>();
        }));
    DataLoaderOptions lo{1, false, 0, false};
    lo.num_replicas = 2;
    lo.rank = rank;
    DataLoader loader(data, lo);
    s.run(loader);
    steps[rank] = s.step_count;
    reasons[rank] = s.stop_reason();
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ(stress_labelled[0], 4);  // every batch of rank 0 has a stress
  EXPECT_EQ(stress_labelled[1], 0);  // none of rank 1's
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(steps[r], 4) << "rank " << r;
    EXPECT_EQ(reasons[r], "") << "rank " << r;
  }
  EXPECT_TRUE(models[0]->a.equal(models[1]->a));
  EXPECT_TRUE(models[0]->b.equal(models[1]->b));
  EXPECT_NE(models[0]->a.item<double>(), 0.5);
}

/// Records which structures (by the x of their second atom, unique here)
/// each batch of epoch 0 held.
class SeenHook : public Hook {
 public:
  explicit SeenHook(std::map<double, int>& seen, std::mutex& m) : seen_(seen), mutex_(m) {}
  std::string name() const override { return "seen"; }
  bool runs_on_stage(TrainingStage s) const override { return s == TrainingStage::BEFORE_BATCH; }
  void operator()(TrainContext& ctx, TrainingStage) override {
    if (ctx.epoch_count != 0) return;
    const Batch& b = *ctx.batch;
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t g = 0; g < b.num_graphs(); ++g) {
      const int64_t first = b.ptr[g].item<int64_t>();
      ++seen_[b.positions[first + 1][0].item<double>()];
    }
  }

 private:
  std::map<double, int>& seen_;
  std::mutex& mutex_;
};

TEST(DataParallel, TwoWorkerCheckpointResumesWithOneWorkerAtTheRightSample) {
  auto data = trimers(16);  // 2 workers x batch 2: 4 batches per epoch each
  const auto dir = std::filesystem::temp_directory_path() /
                   ("crucible_dp_resume_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto store = std::make_shared<checkpoint::CheckpointStore>(dir);
  std::map<double, int> seen;
  std::mutex seen_mutex;
  const int port = free_local_port();
  auto worker = [&](int rank) {
    StrategyOptions o = sgd_options(1);
    o.num_steps.reset();
    o.num_epochs = 2;
    o.communicator = connect(rank, 2, port);
    ToyModel model(0.5, 1.0, 0.0);
    TrainingStrategy s(model.ptr(), o, energy_forces_loss());
    CheckpointHookOptions co;
    co.every_n_epochs = 0;
    co.at_end = false;
    s.register_hook(std::make_shared<CheckpointHook>(store, co));
    s.register_hook(std::make_shared<SeenHook>(seen, seen_mutex));
    // Rank 0 alone asks to stop after its 2nd batch: the flag rides in the
    // 3rd batch's gradient all-reduce, and both stop after that batch.
    if (rank == 0) {
      s.register_hook(std::make_shared<LambdaHook>(
          "stop", std::set<TrainingStage>{TrainingStage::AFTER_BATCH},
          [](TrainContext& ctx, TrainingStage) {
            if (ctx.batch_count == 2) ctx.strategy->request_stop();
          }));
    }
    DataLoaderOptions lo{2, true, 3, false};
    lo.num_replicas = 2;
    lo.rank = rank;
    DataLoader loader(data, lo);
    s.run(loader);
    EXPECT_TRUE(s.stopped_early()) << "rank " << rank;
    EXPECT_EQ(s.step_count, 3) << "rank " << rank;
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  int before = 0;
  for (const auto& [x, n] : seen) before += n;
  EXPECT_EQ(before, 12) << "3 batches x 2 structures x 2 workers";
  ASSERT_EQ(store->list().size(), 1u) << "rank 0 alone wrote the stop checkpoint";

  // One worker, batch 2, resumes: the 4 structures left of epoch 0, once each.
  StrategyOptions o = sgd_options(1);
  o.num_steps.reset();
  o.num_epochs = 2;
  ToyModel model(0.1, 0.1, 0.1);
  TrainingStrategy s(model.ptr(), o, energy_forces_loss());
  s.register_hook(std::make_shared<SeenHook>(seen, seen_mutex));
  restore_checkpoint(*store, s);
  DataLoader loader(data, {2, true, 3, false});
  s.run(loader);
  EXPECT_EQ(seen.size(), 16u) << "every structure of epoch 0 seen";
  for (const auto& [x, n] : seen) EXPECT_EQ(n, 1) << "structure at x=" << x << " seen " << n << " times";
  // Epoch 0 ended after 2 more steps; epoch 1 had 8 batches of one worker.
  EXPECT_EQ(s.epoch_count, 2);
  EXPECT_EQ(s.step_count, 3 + 2 + 8);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crucible
