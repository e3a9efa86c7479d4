// Training speed and accuracy of SchNet in the configuration of the Python
// reference (bench/reference/reference_schnet.py): 64 features, 64 filters,
// 3 interactions, 20 Gaussians, 5 Å cutoff; batch 8, Adam lr 1e-3, loss =
// MSE(E/N) + 10 MSE(F), 1 CPU thread, neighbor lists built once before
// training. The first --valid frames are the validation set (as in
// reference_train_eval.py). Prints one line of key=value figures; run by
// bench/run_benchmarks.py.
// Run: ./build/bench/bench_schnet_training DATA.extxyz [--steps 200]
//      [--precision 32-true|bf16-mixed] [--valid 50] [--threads 1]

#include "crucible/data/extxyz.h"
#include "crucible/losses/loss.h"
#include "crucible/models/schnet.h"
#include "crucible/training/allocator.h"
#include "crucible/training/memory_estimate.h"
#include "crucible/training/blas_kernels.h"
#include "crucible/training/metrics.h"
#include "crucible/training/strategy.h"
#include "op_profile.h"

#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace crucible;

/// Resident set size now, KiB.
long current_rss_kib() { return static_cast<long>(resident_memory_bytes() / 1024); }

}  // namespace

int main(int argc, char** argv) {
  select_blas_kernels(argc, argv);  // as crucible's main does
  tune_allocator_for_training();  // first, as crucible's main does
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DATA.extxyz [--steps N] [--precision P] [--valid N] [--threads N] [--width K] [--seed S] [--profile K]\n", argv[0]);
    return 1;
  }
  std::string data_path = argv[1], precision = "32-true";
  int64_t steps = 200, n_valid = 50, threads = 1;
  int64_t width = 64;  // --width: hidden_channels = num_filters (schnetpack's default is 128)
  int64_t seed = 0;  // --seed: the initial weights (the spread of the MAE between seeds)
  int64_t profile_ops = 0;  // --profile K: the K ops (with input shapes) that took the most time, on stderr
  for (int k = 2; k + 1 < argc; k += 2) {
    const std::string key = argv[k], value = argv[k + 1];
    if (key == "--steps") steps = std::atoll(value.c_str());
    else if (key == "--profile") profile_ops = std::atoll(value.c_str());
    else if (key == "--width") width = std::atoll(value.c_str());
    else if (key == "--seed") seed = std::atoll(value.c_str());
    else if (key == "--precision") precision = value;
    else if (key == "--valid") n_valid = std::atoll(value.c_str());
    else if (key == "--threads") threads = std::atoll(value.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 1;
    }
  }
  at::set_num_threads(static_cast<int>(threads));
  auto frames = read_extxyz(data_path);
  std::vector<Structure> valid(frames.begin(), frames.begin() + n_valid);
  std::vector<Structure> train(frames.begin() + n_valid, frames.end());
  auto train_ds = std::make_shared<AtomicDataset>(train, 5.0);
  auto valid_ds = std::make_shared<AtomicDataset>(valid, 5.0);

  SchNetOptions so;
  so.hidden_channels = width;
  so.num_filters = width;
  so.num_interactions = 3;
  so.num_gaussians = 20;
  so.cutoff = 5.0;
  at::manual_seed(static_cast<uint64_t>(seed));
  SchNet model(so);
  const at::Tensor e0 = fit_reference_energies(train);
  const auto [scale, shift] = fit_energy_scale_shift(train, e0);
  model->set_energy_normalization(e0, scale, shift);

  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(true), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  StrategyOptions o;
  o.num_steps = steps;
  o.optimizer.name = "adam";
  o.optimizer.lr = 1e-3;
  o.precision = precision;
  TrainingStrategy strategy(model.ptr(), o, std::move(loss));

  std::vector<double> times;
  std::chrono::steady_clock::time_point t0;
  long rss_early = 0;
  int64_t atoms = 0, structures = 0;
  strategy.register_hook(std::make_shared<LambdaHook>(
      "timer", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH, TrainingStage::AFTER_BATCH},
      [&](TrainContext& ctx, TrainingStage stage) {
        if (stage == TrainingStage::BEFORE_BATCH) {
          t0 = std::chrono::steady_clock::now();
          return;
        }
        if (ctx.batch_count > 5) {
          times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          atoms += ctx.batch->positions.size(0);
          structures += ctx.batch->num_graphs();
        }
        if (ctx.batch_count == std::min<int64_t>(50, steps)) rss_early = current_rss_kib();
      }));
  DataLoader loader(train_ds, {8, true, 0, true});
  if (profile_ops > 0) crucible::bench::start_op_profile();
  strategy.run(loader);
  if (profile_ops > 0) crucible::bench::stop_op_profile(stderr, static_cast<size_t>(profile_ops));
  const long rss_end = current_rss_kib();
  std::sort(times.begin(), times.end());
  const double ms = 1e3 * times[times.size() / 2];
  const double per_structure = static_cast<double>(structures) / static_cast<double>(times.size());
  const double per_atom = static_cast<double>(atoms) / static_cast<double>(times.size());

  EvaluateOptions eo;
  eo.batch_size = 8;
  eo.dtype = strategy.batch_dtype();
  const ValidationSummary v = evaluate_model(*model, *valid_ds, at::kCPU, eo);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("crucible precision=%s structures_per_s=%.2f atoms_per_s=%.0f ms_per_step=%.2f "
              "energy_mae_mev_per_atom=%.3f forces_mae_mev_per_a=%.3f peak_rss_mib=%.1f "
              "rss_growth_kib=%ld steps=%lld malloc=%s\n",
              precision.c_str(), per_structure * 1e3 / ms, per_atom * 1e3 / ms, ms, v.energy_mae,
              v.forces_mae, usage.ru_maxrss / 1024.0, rss_end - rss_early,
              static_cast<long long>(steps), active_malloc());
  return 0;
}
