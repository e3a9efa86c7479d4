// Time per atom against system size (issue 7): neighbor list (5 Å) and one
// SchNet energy + forces evaluation (64 features, 3 interactions, 20
// Gaussians, float32, 1 thread) for rattled fcc Cu cells of 32, 256, 2048
// and 16384 atoms. Prints one key=value line per size; run by
// bench/run_benchmarks.py. Run: ./build/bench/bench_size_scaling

#include "crucible/data/dataset.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/schnet.h"
#include "crucible/neighbors/neighbor_list.h"
#include "fcc_cu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  using namespace crucible;
  at::set_num_threads(1);
  SchNetOptions so;
  so.hidden_channels = 64;
  so.num_filters = 64;
  so.num_interactions = 3;
  so.num_gaussians = 20;
  so.cutoff = 5.0;
  at::manual_seed(0);
  SchNet model(so);
  for (int rep : {2, 4, 8, 16}) {
    const Structure s = bench::fcc_cu_structure(rep);
    const int64_t n = s.num_atoms();
    const int reps = n <= 256 ? 20 : (n <= 2048 ? 5 : 2);
    int64_t edges = 0;
    const double nl = best_seconds(reps, [&] {
      edges = build_neighbor_list(s.positions, s.cell, s.pbc, 5.0).num_edges();
    });
    AtomicDataset ds({s}, 5.0);
    const Batch batch = ds.collate({0}).to(at::kCPU, at::kFloat);
    const double model_s = best_seconds(std::max(1, reps / 2), [&] {
      ComputeOptions co;
      co.forces = true;
      (void)compute_outputs(*model, batch, co);
    });
    std::printf("atoms=%lld edges=%lld nl_us_per_atom=%.3f model_us_per_atom=%.2f\n",
                static_cast<long long>(n), static_cast<long long>(edges), 1e6 * nl / n,
                1e6 * model_s / n);
    std::fflush(stdout);
  }
  return 0;
}
