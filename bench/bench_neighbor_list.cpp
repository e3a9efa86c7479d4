// Neighbor-list construction time per structure and per atom: fcc Cu
// (a = 3.61 Å, rattled) with 32, 256, 2048 and 16384 atoms at a 5 Å cutoff.
// Run: ./build/bench_neighbor_list

#include "crucible/neighbors/neighbor_list.h"
#include "fcc_cu.h"

#include <benchmark/benchmark.h>


namespace {

using crucible::bench::fcc_cu;

void BM_NeighborList(benchmark::State& state) {
  auto [positions, cell] = fcc_cu(static_cast<int>(state.range(0)));
  int64_t edges = 0;
  for (auto _ : state) {
    auto nl = crucible::build_neighbor_list(positions, cell, {true, true, true}, 5.0);
    edges = nl.num_edges();
    benchmark::DoNotOptimize(edges);
  }
  state.counters["atoms"] = static_cast<double>(positions.size(0));
  state.counters["edges"] = static_cast<double>(edges);
  state.counters["atoms/s"] = benchmark::Counter(
      static_cast<double>(positions.size(0)), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_NeighborList)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
