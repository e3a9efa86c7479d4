// Data-parallel training throughput (issue 6): with 1 and 2 local workers
// (Gloo over loopback, one CPU thread each), as global training structures/s,
// for the default recipe on the bundled TiAl data (structures of very
// different sizes: workers wait for each other) and configs/ethanol.yaml
// (9 atoms each: balanced). "all-reduce" is the time inside the gradient
// all-reduce per step, waiting for the slower worker included.
// Run: ./build/bench/bench_data_parallel [steps, default 40]
// The process launches itself as the workers (launch_local_workers); each
// worker times the steps after the first 5 (warm-up) and rank 0 prints.

#include "crucible/run/training_setup.h"
#include "crucible/config/config.h"
#include "crucible/distributed/launcher.h"
#include "crucible/distributed/process_group.h"
#include "crucible/training/data_parallel.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

namespace {

using namespace crucible;

constexpr int64_t kWarmup = 5;

int worker(int64_t steps) {
  at::set_num_threads(1);
  std::shared_ptr<Communicator> comm;
  if (auto env = distributed_env_from_environment(); env && env->world_size > 1) {
    comm = make_process_group(*env);
  }
  const bool ethanol = std::string(std::getenv("CRUCIBLE_BENCH_DATA")) == "ethanol";
  Config config = ethanol ? load_config_file(CRUCIBLE_SOURCE_DIR "/configs/ethanol.yaml")
                          : default_config();
  config.data.train_file =
      ethanol ? CRUCIBLE_SOURCE_DIR "/data/molecular_ethanol_rmd17/ethanol_reduced_100.xyz"
              : CRUCIBLE_SOURCE_DIR "/data/alloy_TiAl/TiAl_tutorial.xyz";
  apply_overrides(config, {"training.num_steps=" + std::to_string(steps),
                           "training.validate_every_n_epochs=0"});
  TrainingSetup setup = build_training(config, {}, comm);
  std::chrono::steady_clock::time_point t0;
  int64_t structures = 0;
  setup.strategy->register_hook(std::make_shared<LambdaHook>(
      "timer", std::set<TrainingStage>{TrainingStage::BEFORE_BATCH, TrainingStage::AFTER_BATCH},
      [&](TrainContext& ctx, TrainingStage stage) {
        if (stage == TrainingStage::BEFORE_BATCH && ctx.batch_count == kWarmup) {
          t0 = std::chrono::steady_clock::now();
        }
        if (stage == TrainingStage::AFTER_BATCH && ctx.batch_count > kWarmup) {
          structures += ctx.batch->num_graphs();
        }
      }));
  setup.strategy->validate();  // not timed; also checks the collectives
  setup.strategy->run(*setup.loader);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int world = comm ? comm->size() : 1;
  // Global structures: every worker trains on its own shard.
  double comm_seconds = 0;
  for (const auto& h : setup.strategy->registered_hooks()) {
    if (auto* dp = dynamic_cast<DataParallelHook*>(h.get())) comm_seconds = dp->communication_seconds();
  }
  if (!comm || comm->rank() == 0) {
    std::printf("  %d worker%s  %8.1f structures/s  %6.2f ms/step, of which all-reduce %5.2f ms "
                "(%lld steps, batch %lld per worker)\n",
                world, world == 1 ? " " : "s", structures * world / seconds,
                1e3 * seconds / static_cast<double>(steps - kWarmup),
                1e3 * comm_seconds / static_cast<double>(steps),
                static_cast<long long>(steps - kWarmup),
                static_cast<long long>(config.training.batch_size));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 40;
  if (std::getenv("CRUCIBLE_BENCH_DATA")) return worker(steps);
  std::cout << "bench_data_parallel: training structures/s over all workers (1 CPU thread "
               "each, Gloo over loopback)\n";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (const char* data : {"tial", "ethanol"}) {
    std::cout << (std::string(data) == "tial"
                      ? "default recipe, bundled TiAl data (structure sizes vary):\n"
                      : "configs/ethanol.yaml (9 atoms per structure):\n");
    std::cout.flush();  // before the workers inherit the buffer
    ::setenv("CRUCIBLE_BENCH_DATA", data, 1);
    for (int nproc : {1, 2}) {
      LaunchOptions lo;
      lo.nproc = nproc;
      const int rc = launch_local_workers(self, {std::to_string(steps)}, lo, std::cerr);
      if (rc != 0) return rc;
    }
  }
  return 0;
}
