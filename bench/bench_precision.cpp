// Precision modes compared on the default model (configs/default.yaml values:
// SchNet size, batch size, lr, loss weights) and the bundled TiAl DFT data
// (issue 3): training structures/s under 32-true, bf16-mixed and 64-true, and
// the validation energy / force MAE of each after the same number of epochs
// from the same initial weights and shuffle order.
// Run: ./build/bench/bench_precision [epochs]   (default 3 epochs)

#include "crucible/config/config.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/schnet.h"
#include "crucible/training/strategy.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace crucible;

struct Row {
  std::string mode;
  double structures_per_s = 0;
  double energy_mae = 0;  ///< meV/atom
  double forces_mae = 0;  ///< meV/Å
};

Row run_mode(const std::string& mode, int64_t epochs, const Config& config,
             const std::vector<Structure>& train, const std::vector<Structure>& valid) {
  const auto& tc = config.training;
  auto train_ds = std::make_shared<AtomicDataset>(train, config.model.cutoff);
  auto valid_ds = std::make_shared<AtomicDataset>(valid, config.model.cutoff);
  const SchNetOptions so = schnet_options(config.model.params, config.model.cutoff);
  at::manual_seed(0);  // same initial weights in every mode
  SchNet model(so);
  const at::Tensor e0 = fit_reference_energies(train);
  const auto [scale, shift] = fit_energy_scale_shift(train, e0);
  model->set_energy_normalization(e0, scale, shift);
  WeightedSumLoss loss = loss_from_settings(tc.loss);
  StrategyOptions opt;
  opt.num_epochs = epochs;
  opt.optimizer.lr = tc.optimizer.lr;
  opt.precision = mode;  // model / batch dtypes and, for bf16-mixed, the hook
  opt.optimizer.scheduler = scheduler_config(tc.scheduler);  // the default recipe's cosine schedule
  ValidationConfig vc;
  vc.data = valid_ds;
  vc.every_n_epochs = 0;  // once, after training
  vc.batch_size = tc.valid_batch_size;
  opt.validation = vc;
  TrainingStrategy strategy(model.ptr(), opt, std::move(loss));
  DataLoader loader(train_ds,
                    DataLoaderOptions{tc.batch_size, true, static_cast<uint64_t>(tc.seed), false});
  const auto t0 = std::chrono::steady_clock::now();
  strategy.run(loader);  // training + the final validation
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Row row;
  row.mode = mode;
  row.structures_per_s = static_cast<double>(epochs * train_ds->size()) / seconds;
  row.energy_mae = strategy.last_validation()->energy_mae;
  row.forces_mae = strategy.last_validation()->forces_mae;
  return row;
}

/// GFLOP/s of an edge-shaped matrix product [edges, 64] x [64, 64] in
/// `dtype` on this CPU (the op that dominates SchNet's filter network): what
/// decides whether bf16-mixed can beat 32-true here.
double matmul_gflops(at::ScalarType dtype) {
  const int64_t edges = 11400, width = 64;
  const at::Tensor a = at::randn({edges, width}).to(dtype);
  const at::Tensor b = at::randn({width, width}).to(dtype);
  for (int k = 0; k < 3; ++k) (void)at::mm(a, b);
  const int reps = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < reps; ++k) (void)at::mm(a, b);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * edges * width * width * reps / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t epochs = argc > 1 ? std::atoll(argv[1]) : 3;
  if (epochs < 1) {
    std::fprintf(stderr, "usage: bench_precision [epochs >= 1]\n");
    return 2;
  }
  const Config config = default_config();
  if (config.training.num_threads > 0) {
    at::set_num_threads(static_cast<int>(config.training.num_threads));
  }
  auto all = read_extxyz(CRUCIBLE_SOURCE_DIR "/data/alloy_TiAl/TiAl_tutorial.xyz");
  const auto [train_idx, valid_idx] = random_split(static_cast<int64_t>(all.size()), 0.1,
                                                   static_cast<uint64_t>(config.training.seed));
  std::vector<Structure> train, valid;
  for (int64_t i : train_idx) train.push_back(all[i]);
  for (int64_t i : valid_idx) valid.push_back(all[i]);
  std::printf("TiAl: %zu training / %zu validation structures, %lld epochs, batch size %lld, "
              "%d CPU threads (timing includes the final validation)\n",
              train.size(), valid.size(), static_cast<long long>(epochs),
              static_cast<long long>(config.training.batch_size), at::get_num_threads());
  const double f32 = matmul_gflops(at::kFloat), bf16 = matmul_gflops(at::kBFloat16);
  std::printf("this CPU, [11400,64]x[64,64] matmul: float32 %.1f GFLOP/s, bfloat16 %.1f GFLOP/s "
              "(bf16-mixed can beat 32-true only where bfloat16 is the faster one)\n",
              f32, bf16);
  std::printf("%-12s %14s %18s %16s\n", "precision", "structures/s", "energy MAE meV/at",
              "force MAE meV/A");
  for (const std::string mode : {"64-true", "32-true", "bf16-mixed"}) {
    const Row r = run_mode(mode, epochs, config, train, valid);
    std::printf("%-12s %14.1f %18.2f %16.1f\n", r.mode.c_str(), r.structures_per_s, r.energy_mae,
                r.forces_mae);
    std::fflush(stdout);
  }
  return 0;
}
