// training.num_threads 0 (auto, issue 19 deliverable 4): the order of the
// measured passes, the choice rule, and that a measuring pass leaves no
// trace in the model (crucible/training/thread_choice.h).

#include "crucible/run/training_setup.h"
#include "crucible/training/thread_choice.h"

#include "training/toy_model.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

namespace crucible {
namespace {

/// Restores OMP_NUM_THREADS and the intra-op thread count on scope exit.
class ThreadEnvGuard {
 public:
  ThreadEnvGuard() {
    if (const char* v = std::getenv("OMP_NUM_THREADS")) saved_ = v;
    had_ = std::getenv("OMP_NUM_THREADS") != nullptr;
  }
  ~ThreadEnvGuard() {
    if (had_) ::setenv("OMP_NUM_THREADS", saved_.c_str(), 1);
    else ::unsetenv("OMP_NUM_THREADS");
    at::set_num_threads(1);
  }

 private:
  std::string saved_;
  bool had_ = false;
};

ThreadChoiceOptions quick(int max_threads) {
  ThreadChoiceOptions o;
  o.max_threads = max_threads;
  o.reps = 4;
  o.max_reps = 8;
  o.target_ms = 1;
  return o;
}

TEST(ThreadChoice, OneCoreMeasuresNothing) {
  ThreadEnvGuard guard;
  int calls = 0;
  const ThreadChoice c = choose_thread_count([&] { ++calls; }, quick(1));
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(c.threads, 1);
  EXPECT_EQ(c.source, "one core");
  EXPECT_TRUE(c.timings.empty());
  EXPECT_EQ(at::get_num_threads(), 1);
}

TEST(ThreadChoice, BlocksOfOneThenNThreadsEachWithAWarmUp) {
  ThreadEnvGuard guard;
  std::vector<int> seen;
  ThreadChoiceOptions o = quick(3);
  o.target_ms = 1e9;  // never met: each block runs max_reps / 2 timed passes
  const ThreadChoice c = choose_thread_count([&] { seen.push_back(at::get_num_threads()); }, o);
  // Blocks 1, 3, 1, 3: a warm-up plus 4 timed passes each.
  const std::vector<int> expected{1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3};
  EXPECT_EQ(seen, expected);
  ASSERT_EQ(c.timings.size(), 2u);
  EXPECT_EQ(c.timings[0].threads, 1);
  EXPECT_EQ(c.timings[1].threads, 3);
  EXPECT_EQ(c.source, "measured");
  EXPECT_EQ(at::get_num_threads(), c.threads);
}

/// A pass that sleeps `one_ms` with 1 thread and `many_ms` otherwise.
std::function<void()> sleeping(int one_ms, int many_ms) {
  return [=] {
    std::this_thread::sleep_for(std::chrono::milliseconds(at::get_num_threads() == 1 ? one_ms : many_ms));
  };
}

/// A pass that takes `one_ms` with 1 thread and `many_ms` otherwise on a
/// simulated clock (`now`), so ties are exact whatever the machine's load.
std::function<void()> simulated(double* now, double one_ms, double many_ms) {
  return [=] { *now += at::get_num_threads() == 1 ? one_ms : many_ms; };
}

TEST(ThreadChoice, TheFasterSettingWinsAndTiesKeepOneThread) {
  ThreadEnvGuard guard;
  double now = 0;
  auto on_clock = [&](ThreadChoiceOptions o) {
    o.clock_ms = [&] { return now; };
    return o;
  };
  // Sleeps of 24 ms against 3 ms: the rule, not the machine, is tested.
  ThreadChoice c = choose_thread_count(sleeping(24, 3), quick(2));
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_GT(c.timings[0].ms_per_pass, 20.0);
  EXPECT_LT(c.timings[1].ms_per_pass, c.timings[0].ms_per_pass);
  c = choose_thread_count(sleeping(3, 24), quick(2));
  EXPECT_EQ(c.threads, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  // Close calls on a simulated clock (sleeps under load drift by 10%):
  // 1.075x faster with 2 threads: above the default min_speedup (1.05), so 2.
  c = choose_thread_count(simulated(&now, 43, 40), on_clock(quick(2)));
  EXPECT_EQ(c.threads, 2);
  EXPECT_DOUBLE_EQ(c.timings[0].ms_per_pass, 43.0);
  // The same passes against min_speedup 1.1: 1.
  ThreadChoiceOptions strict = quick(2);
  strict.min_speedup = 1.1;
  c = choose_thread_count(simulated(&now, 43, 40), on_clock(strict));
  EXPECT_EQ(c.threads, 1);
  // Equal passes: ties keep one thread.
  c = choose_thread_count(simulated(&now, 20, 20), on_clock(quick(2)));
  EXPECT_EQ(c.threads, 1);
  EXPECT_NE(c.describe().find("1 (auto, the faster on the first batch: 1 thread "), std::string::npos)
      << c.describe();
  EXPECT_NE(c.describe().find("2 threads "), std::string::npos) << c.describe();
}

TEST(ThreadChoice, BadOptionsThrow) {
  ThreadEnvGuard guard;
  ThreadChoiceOptions o = quick(0);
  EXPECT_THROW(choose_thread_count([] {}, o), std::invalid_argument);
  o = quick(2);
  o.reps = 0;
  EXPECT_THROW(choose_thread_count([] {}, o), std::invalid_argument);
  o = quick(2);
  o.max_reps = 2;
  EXPECT_THROW(choose_thread_count([] {}, o), std::invalid_argument);
  o = quick(2);
  o.min_speedup = 0;
  EXPECT_THROW(choose_thread_count([] {}, o), std::invalid_argument);
}

TEST(ThreadChoice, TrainingPassLeavesParametersAndGradientsAsTheyWere) {
  auto model = std::make_shared<testing::ToyModelImpl>(1.3, 0.7, 0.2);
  const auto ds = testing::toy_dataset(4);
  const Batch batch = ds->collate({0, 1, 2, 3});
  const auto pass = training_pass(*model, batch);
  // Undefined gradients stay undefined.
  pass();
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  // Defined ones keep their values: the pass's backward does not accumulate into them.
  for (auto& p : model->parameters()) p.mutable_grad() = at::full_like(p, 0.25);
  const at::Tensor a = model->a.detach().clone();
  pass();
  pass();
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().item<double>(), 0.25);
  }
  EXPECT_TRUE(at::equal(model->a, a));
  // The pass does the backward: a gradient hook on `a` sees it.
  int hook_calls = 0;
  model->a.register_hook([&](const at::Tensor& g) {
    ++hook_calls;
    EXPECT_TRUE(at::isfinite(g).all().item<bool>());
    EXPECT_NE(g.item<double>(), 0.0);
  });
  pass();
  EXPECT_EQ(hook_calls, 1);
}

TEST(ThreadChoice, ResolveTakesTheKeyThenOmpNumThreadsThenMeasures) {
  ThreadEnvGuard guard;
  auto model = std::make_shared<testing::ToyModelImpl>();
  const auto ds = testing::toy_dataset(4);
  ThreadChoice c = resolve_thread_count(2, at::kCPU, *model, *ds, 2, at::kDouble);
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.source, "training.num_threads");
  ::setenv("OMP_NUM_THREADS", "2", 1);
  c = resolve_thread_count(0, at::kCPU, *model, *ds, 2, at::kDouble);
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.source, "auto: OMP_NUM_THREADS");
  EXPECT_EQ(at::get_num_threads(), 2);
  ::unsetenv("OMP_NUM_THREADS");
  c = resolve_thread_count(0, at::kCPU, *model, *ds, 2, at::kDouble);
  if (available_cpu_cores() / local_worker_count() > 1) {
    EXPECT_EQ(c.source, "measured");
    ASSERT_EQ(c.timings.size(), 2u);
    EXPECT_GT(c.timings[0].ms_per_pass, 0.0);
  } else {
    EXPECT_EQ(c.threads, 1);
    EXPECT_EQ(c.source, "auto: one core per worker");
  }
  EXPECT_EQ(at::get_num_threads(), c.threads);
}

TEST(ThreadChoice, WorkersOnThisMachineShareItsCores) {
  const char* names[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE",
                         "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"};
  for (const char* n : names) ::unsetenv(n);
  EXPECT_EQ(local_worker_count(), 1);
  ::setenv("WORLD_SIZE", "4", 1);
  EXPECT_EQ(local_worker_count(), 4);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);  // torchrun on two machines
  EXPECT_EQ(local_worker_count(), 2);
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::unsetenv("WORLD_SIZE");
  ::setenv("SLURM_NTASKS_PER_NODE", "3(x2)", 1);
  EXPECT_EQ(local_worker_count(), 3);
  ::unsetenv("SLURM_NTASKS_PER_NODE");
  EXPECT_GE(available_cpu_cores(), 1);
  EXPECT_LE(available_cpu_cores(), static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace crucible
