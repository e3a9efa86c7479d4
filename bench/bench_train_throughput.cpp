// Training throughput of the default model (configs/default.yaml values:
// SchNet, dtype, batch size) on the bundled TiAl DFT data: optimizer steps
// with energy + forces (+ stress) losses, reported as structures/s and atoms/s.
// Run: ./build/bench_train_throughput  (add --benchmark_min_time=5 for steadier figures)

#include "crucible/config/config.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/schnet.h"
#include "crucible/training/strategy.h"

#include <benchmark/benchmark.h>

#include <memory>

namespace {

using namespace crucible;

struct Fixture {
  Config config = default_config();
  std::shared_ptr<AtomicDataset> dataset;
  std::unique_ptr<DataLoader> loader;
  SchNet model{nullptr};
  std::unique_ptr<TrainingStrategy> strategy;

  Fixture() {
    const auto& tc = config.training;
    if (tc.num_threads > 0) at::set_num_threads(static_cast<int>(tc.num_threads));
    const at::ScalarType dtype = tc.dtype == "float64" ? at::kDouble : at::kFloat;
    auto structures = read_extxyz(CRUCIBLE_SOURCE_DIR "/data/alloy_TiAl/TiAl_tutorial.xyz");
    dataset = std::make_shared<AtomicDataset>(structures, config.model.cutoff);
    const SchNetOptions so = schnet_options(config.model.params, config.model.cutoff);
    at::manual_seed(0);
    model = SchNet(so);
    model->to(dtype);
    const at::Tensor e0 = fit_reference_energies(structures);
    const auto [scale, shift] = fit_energy_scale_shift(structures, e0);
    model->set_energy_normalization(e0, scale, shift);
    WeightedSumLoss loss = loss_from_settings(tc.loss);
    StrategyOptions so2;
    so2.num_steps = 1;
    so2.dtype = dtype;
    so2.optimizer.lr = tc.optimizer.lr;
    strategy = std::make_unique<TrainingStrategy>(model.ptr(), so2, std::move(loss));
    loader = std::make_unique<DataLoader>(
        dataset, DataLoaderOptions{tc.batch_size, true, static_cast<uint64_t>(tc.seed), false});
  }
};

void BM_TrainStep(benchmark::State& state) {
  static Fixture f;
  int64_t k = 0, structures = 0, atoms = 0;
  for (auto _ : state) {
    if (k == f.loader->size()) {
      k = 0;
      f.loader->set_epoch(f.loader->epoch() + 1);
    }
    Batch batch = f.loader->batch(k++);  // collation is part of a training step
    f.strategy->train_batch(batch);
    structures += batch.num_graphs();
    atoms += batch.num_nodes();
  }
  state.counters["structures/s"] =
      benchmark::Counter(static_cast<double>(structures), benchmark::Counter::kIsRate);
  state.counters["atoms/s"] =
      benchmark::Counter(static_cast<double>(atoms), benchmark::Counter::kIsRate);
  state.counters["batch_size"] = static_cast<double>(f.config.training.batch_size);
  state.counters["threads"] = static_cast<double>(at::get_num_threads());
}
BENCHMARK(BM_TrainStep)->Unit(benchmark::kMillisecond)->MinTime(3.0)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
