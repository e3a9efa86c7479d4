// Hook and stage dispatch overhead (issue 7): time per stage dispatch with
// 10 registered no-op hooks (TrainingStrategy::dispatch_stage, the path
// run() takes), against the same strategy with no hooks; and resident
// memory over 10000 training steps (train_batch with the 10 hooks) of a
// small model, to show no per-step growth.
// Prints one line of key=value figures; run by bench/run_benchmarks.py.
// Run: ./build/bench/bench_hook_dispatch [dispatches, default 2000000]

#include "crucible/data/dataset.h"
#include "crucible/losses/loss.h"
#include "crucible/training/allocator.h"
#include "crucible/training/memory_estimate.h"
#include "crucible/training/strategy.h"
#include "crucible/training/update_hook.h"

#include <ATen/Parallel.h>
#include <torch/nn/cloneable.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

using namespace crucible;

/// E = a Σ_i |r_i|² per structure (eV); a single parameter.
class HarmonicImpl : public torch::nn::Cloneable<HarmonicImpl>, public EnergyModel {
 public:
  HarmonicImpl() { reset(); }
  void reset() override { a = register_parameter("a", at::ones({}, at::kDouble)); }
  at::Tensor energy(const Batch& batch) override {
    const at::Tensor e = a * batch.positions.pow(2).sum(-1);
    return at::zeros({batch.num_graphs()}, e.options()).index_add(0, batch.batch, e);
  }
  torch::nn::Module& module() override { return *this; }
  double cutoff() const override { return 1.0; }
  std::string name() const override { return "harmonic"; }
  at::Tensor a;
};
TORCH_MODULE(Harmonic);

/// Counts its calls; runs on every stage a plain hook may (the update
/// stages belong to the update orchestrator).
class NoOpHook : public Hook {
 public:
  std::string name() const override { return "noop"; }
  bool runs_on_stage(TrainingStage stage) const override {
    return !is_training_update_stage(stage);
  }
  void operator()(TrainContext&, TrainingStage) override { ++calls; }
  int64_t calls = 0;
};

double seconds_per_dispatch(int hooks, int64_t n) {
  Harmonic model;
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(true), 1.0);
  StrategyOptions o;
  o.num_steps = 1;
  o.dtype = at::kDouble;
  TrainingStrategy s(model.ptr(), o, std::move(loss));
  std::vector<std::shared_ptr<NoOpHook>> registered;
  for (int h = 0; h < hooks; ++h) {
    registered.push_back(std::make_shared<NoOpHook>());
    s.register_hook(registered.back());
  }
  for (int w = 0; w < 1000; ++w) s.dispatch_stage(TrainingStage::AFTER_BATCH);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < n; ++k) s.dispatch_stage(TrainingStage::AFTER_BATCH);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!registered.empty() && registered[0]->calls != n + 1000) std::abort();
  return dt / static_cast<double>(n);
}

}  // namespace

long current_rss_kib() { return static_cast<long>(crucible::resident_memory_bytes() / 1024); }

/// Resident KiB after 1000 and after 10000 steps.
std::pair<long, long> rss_over_steps() {
  Harmonic model;
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(true), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 1.0);
  StrategyOptions o;
  o.num_steps = 10000;
  o.dtype = at::kDouble;
  o.optimizer.lr = 1e-6;
  TrainingStrategy s(model.ptr(), o, std::move(loss));
  for (int h = 0; h < 10; ++h) s.register_hook(std::make_shared<NoOpHook>());
  Structure st;
  st.positions = at::rand({32, 3}, at::kDouble);
  st.atomic_numbers = at::full({32}, 29, at::kLong);
  st.cell = at::zeros({3, 3}, at::kDouble);
  st.energy = 1.0;
  st.forces = at::zeros({32, 3}, at::kDouble);
  AtomicDataset ds({st}, 1.0);
  const Batch batch = ds.collate({0});
  long early = 0;
  for (int k = 1; k <= 10000; ++k) {
    s.train_batch(batch);
    if (k == 1000) early = current_rss_kib();
  }
  return {early, current_rss_kib()};
}

int main(int argc, char** argv) {
  crucible::tune_allocator_for_training();  // first, as crucible's main does
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 2000000;
  at::set_num_threads(1);
  double best0 = 1e9, best10 = 1e9;
  for (int rep = 0; rep < 5; ++rep) {  // interleaved, best of 5
    best0 = std::min(best0, seconds_per_dispatch(0, n));
    best10 = std::min(best10, seconds_per_dispatch(10, n));
  }
  const auto [early, late] = rss_over_steps();
  std::printf("hooks=10 ns_per_stage_no_hooks=%.1f ns_per_stage_dispatch=%.1f "
              "ns_per_hook_call=%.1f rss_kib_step_1000=%ld rss_kib_step_10000=%ld\n",
              1e9 * best0, 1e9 * best10, 1e9 * (best10 - best0) / 10.0, early, late);
  return 0;
}
