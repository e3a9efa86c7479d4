// Hook and stage dispatch overhead (issue 7): the time a training batch
// spends calling 10 registered no-op hooks, per stage dispatch, measured as
// the difference between train_batch() with 10 hooks and with none on a
// model whose step is cheap (a one-parameter harmonic energy on 4 atoms).
// Prints one line of key=value figures; run by bench/run_benchmarks.py.
// Run: ./build/bench/bench_hook_dispatch [batches, default 20000]

#include "crucible/data/dataset.h"
#include "crucible/losses/loss.h"
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

double seconds_per_batch(int hooks, int64_t batches, const Batch& batch, int64_t* stages) {
  Harmonic model;
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(true), 1.0);
  StrategyOptions o;
  o.num_steps = batches;
  o.dtype = at::kDouble;
  o.optimizer.name = "sgd";
  o.optimizer.lr = 1e-6;
  TrainingStrategy s(model.ptr(), o, std::move(loss));
  std::vector<std::shared_ptr<NoOpHook>> registered;
  for (int h = 0; h < hooks; ++h) {
    registered.push_back(std::make_shared<NoOpHook>());
    s.register_hook(registered.back());
  }
  for (int w = 0; w < 200; ++w) s.train_batch(batch);  // warm-up
  const int64_t before = registered.empty() ? 0 : registered[0]->calls;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < batches; ++b) s.train_batch(batch);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stages && !registered.empty()) *stages = (registered[0]->calls - before) / batches;
  return dt / static_cast<double>(batches);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batches = argc > 1 ? std::atoll(argv[1]) : 20000;
  at::set_num_threads(1);
  Structure st;
  st.positions = at::rand({4, 3}, at::kDouble);
  st.atomic_numbers = at::full({4}, 29, at::kLong);
  st.cell = at::zeros({3, 3}, at::kDouble);
  st.energy = 1.0;
  AtomicDataset ds({st}, 1.0);
  const Batch batch = ds.collate({0});
  int64_t stages = 0;
  double best0 = 1e9, best10 = 1e9;
  for (int rep = 0; rep < 5; ++rep) {  // interleaved, best of 5
    best0 = std::min(best0, seconds_per_batch(0, batches, batch, nullptr));
    best10 = std::min(best10, seconds_per_batch(10, batches, batch, &stages));
  }
  const double per_stage_ns = 1e9 * (best10 - best0) / static_cast<double>(stages);
  std::printf("hooks=10 stages_per_batch=%lld batch_us_no_hooks=%.2f batch_us_10_hooks=%.2f "
              "ns_per_stage_dispatch=%.1f ns_per_hook_call=%.1f\n",
              static_cast<long long>(stages), 1e6 * best0, 1e6 * best10, per_stage_ns,
              per_stage_ns / 10.0);
  return 0;
}
