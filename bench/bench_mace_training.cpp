// Training speed and accuracy of MACE in the reference configuration of
// issue 16 (MACE v0.3.14 defaults as measured there): hidden irreps
// 32x0e+32x1o, harmonics to l = 3, correlation 3, 2 interactions, 8 Bessel
// functions, radial MLP [64, 64, 64], r_max 5 Å; batch 8, AMSGrad lr 0.01,
// loss = 1 · MSE(E/N) + 100 · MSE(F), gradient norm clipped at 10, E0s by
// least squares, scale = RMS
// force, shift = mean per-atom residual; 1 CPU thread; neighbor lists built
// once. The first --valid frames are the validation set. Validation after
// every epoch; prints one line of key=value figures (best force MAE and the
// epoch it was reached). Run by bench/run_benchmarks.py.
// Run: ./build/bench/bench_mace_training DATA.extxyz [--epochs 4] [--valid 50]
//      [--hidden 32x0e+32x1o] [--precision 32-true|bf16-mixed] [--threads 1]
//      [--steps N (stop after N steps; speed only)] [--profile K (op profile)]

#include "crucible/data/extxyz.h"
#include "crucible/losses/loss.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "crucible/training/allocator.h"
#include "crucible/training/blas_kernels.h"
#include "crucible/training/gradient_clipping.h"
#include "crucible/training/metrics.h"
#include "crucible/training/strategy.h"
#include "op_profile.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

using namespace crucible;


int main(int argc, char** argv) {
  select_blas_kernels(argc, argv);  // as crucible's main does
  tune_allocator_for_training();
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DATA.extxyz [--epochs N] [--valid N] [--hidden IRREPS] [--precision P] [--threads N] [--steps N] [--profile K]\n", argv[0]);
    return 1;
  }
  std::string data_path = argv[1], precision = "32-true", hidden = "32x0e+32x1o";
  int64_t epochs = 4, n_valid = 50, threads = 1, max_steps = 0;
  int64_t profile_ops = 0;  // --profile K: the K ops (with input shapes) that took the most time, on stderr
  for (int k = 2; k + 1 < argc; k += 2) {
    const std::string key = argv[k], value = argv[k + 1];
    if (key == "--epochs") epochs = std::atoll(value.c_str());
    else if (key == "--valid") n_valid = std::atoll(value.c_str());
    else if (key == "--hidden") hidden = value;
    else if (key == "--precision") precision = value;
    else if (key == "--threads") threads = std::atoll(value.c_str());
    else if (key == "--steps") max_steps = std::atoll(value.c_str());
    else if (key == "--profile") profile_ops = std::atoll(value.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 1;
    }
  }
  at::set_num_threads(static_cast<int>(threads));
  auto frames = read_extxyz(data_path);
  std::vector<Structure> valid(frames.begin(), frames.begin() + n_valid);
  std::vector<Structure> train(frames.begin() + n_valid, frames.end());
  const double cutoff = 5.0;
  auto train_ds = std::make_shared<AtomicDataset>(train, cutoff);
  auto valid_ds = std::make_shared<AtomicDataset>(valid, cutoff);

  MaceOptions mo;
  mo.hidden_irreps = hidden;
  if (const char* r = std::getenv("CRUCIBLE_BENCH_RADIAL_MLP")) {  // e.g. "64,64,64" (experiments)
    mo.radial_mlp.clear();
    for (std::string s = r; !s.empty();) {
      const size_t k = s.find(',');
      mo.radial_mlp.push_back(std::atoll(s.substr(0, k).c_str()));
      s = k == std::string::npos ? "" : s.substr(k + 1);
    }
  }
  mo.cutoff = cutoff;
  std::set<int64_t> zs;
  int64_t edges = 0, atoms_total = 0;
  for (int64_t k = 0; k < train_ds->size(); ++k) {
    edges += train_ds->neighbor_list(k).edge_index.size(1);
    atoms_total += train[static_cast<size_t>(k)].num_atoms();
  }
  for (const auto& s : train) {
    const at::Tensor z = s.atomic_numbers;
    for (int64_t a = 0; a < z.numel(); ++a) zs.insert(z[a].item<int64_t>());
  }
  mo.atomic_numbers.assign(zs.begin(), zs.end());
  mo.avg_num_neighbors = average_num_neighbors(edges, atoms_total);
  at::manual_seed(0);
  Mace model(mo);
  const at::Tensor e0 = fit_reference_energies(train);
  const auto [scale, shift] = fit_energy_scale_shift(train, e0);
  model->set_energy_normalization(e0, scale, shift);

  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(true), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 100.0);
  StrategyOptions o;
  o.num_epochs = epochs;
  o.optimizer.name = "adam";
  o.optimizer.lr = 0.01;
  o.optimizer.amsgrad = true;
  o.precision = precision;
  TrainingStrategy strategy(model.ptr(), o, std::move(loss));
  {
    GradientClippingOptions clip;  // MACE's default clip_grad = 10
    clip.max_norm = 10.0;
    strategy.register_hook(std::make_shared<GradientClippingHook>(clip));
  }

  std::vector<double> times;
  std::chrono::steady_clock::time_point t0;
  int64_t atoms = 0, structures = 0;
  std::vector<std::pair<double, double>> maes;  // per epoch: energy meV/atom, forces meV/Å
  EvaluateOptions eo;
  eo.batch_size = 8;
  eo.dtype = strategy.batch_dtype();
  bool stop = false;
  // CRUCIBLE_PROFILE=trace.json: a Chrome trace of step 6 (LibTorch's profiler).
  const char* profile_path = std::getenv("CRUCIBLE_PROFILE");
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profiler;
  strategy.register_hook(std::make_shared<LambdaHook>(
      "timer", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH, TrainingStage::AFTER_BATCH, TrainingStage::AFTER_EPOCH},
      [&](TrainContext& ctx, TrainingStage stage) {
        if (stage == TrainingStage::BEFORE_BATCH) {
          if (profile_path && ctx.batch_count == 5) profiler = std::make_unique<torch::autograd::profiler::RecordProfile>(profile_path);
          t0 = std::chrono::steady_clock::now();
          return;
        }
        if (stage == TrainingStage::AFTER_EPOCH) {
          if (stop) return;
          const ValidationSummary v = evaluate_model(*model, *valid_ds, at::kCPU, eo);
          maes.emplace_back(v.energy_mae, v.forces_mae);
          std::fprintf(stderr, "epoch %zu: E MAE %.2f meV/atom, F MAE %.2f meV/A\n", maes.size(), v.energy_mae, v.forces_mae);
          return;
        }
        if (profiler && ctx.batch_count == 6) profiler.reset();
        if (ctx.batch_count > 3) {
          times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          atoms += ctx.batch->positions.size(0);
          structures += ctx.batch->num_graphs();
        }
        if (max_steps > 0 && ctx.batch_count >= max_steps) {
          stop = true;
          strategy.request_stop("--steps reached");
        }
      }));
  DataLoader loader(train_ds, {8, true, 0, true});
  if (profile_ops > 0) crucible::bench::start_op_profile();
  strategy.run(loader);
  if (profile_ops > 0) crucible::bench::stop_op_profile(stderr, static_cast<size_t>(profile_ops));
  // The model as training left it, on the validation frames (bf16 against 32-true after the same steps).
  const ValidationSummary final_v = evaluate_model(*model, *valid_ds, at::kCPU, eo);
  std::sort(times.begin(), times.end());
  const double ms = 1e3 * times[times.size() / 2];
  const double per_structure = static_cast<double>(structures) / static_cast<double>(times.size());
  double best_f = 1e300, best_e = 0;
  int64_t best_epoch = 0;
  for (size_t k = 0; k < maes.size(); ++k)
    if (maes[k].second < best_f) {
      best_f = maes[k].second;
      best_e = maes[k].first;
      best_epoch = static_cast<int64_t>(k) + 1;
    }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  int64_t nparams = 0;
  for (const auto& p : model->parameters()) nparams += p.numel();
  std::printf("crucible_mace hidden=%s precision=%s structures_per_s=%.2f ms_per_step=%.2f best_forces_mae_mev_per_a=%.3f "
              "best_energy_mae_mev_per_atom=%.3f best_epoch=%lld epochs=%zu parameters=%lld avg_num_neighbors=%.2f "
              "peak_rss_mib=%.1f blas=%s malloc=%s energy_mae_mev_per_atom=%.3f forces_mae_mev_per_a=%.3f\n",
              hidden.c_str(), precision.c_str(), per_structure * 1e3 / ms, ms, maes.empty() ? -1.0 : best_f, best_e,
              static_cast<long long>(best_epoch), maes.size(), static_cast<long long>(nparams), mo.avg_num_neighbors,
              usage.ru_maxrss / 1024.0, blas_core_name().c_str(), active_malloc(), final_v.energy_mae, final_v.forces_mae);
  return 0;
}
