// Neighbor-list construction time per structure and per atom: fcc Cu
// (a = 3.61 Å, rattled) with 32, 256, 2048 and 16384 atoms at a 5 Å cutoff.
// Run: ./build/bench_neighbor_list

#include "crucible/neighbors/neighbor_list.h"

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

std::pair<at::Tensor, at::Tensor> fcc_cu(int rep) {
  const double a = 3.61;
  std::mt19937_64 gen(7);
  std::normal_distribution<double> noise(0.0, 0.02);
  const double basis[4][3] = {{0, 0, 0}, {0.5, 0.5, 0}, {0.5, 0, 0.5}, {0, 0.5, 0.5}};
  std::vector<double> pos;
  for (int x = 0; x < rep; ++x)
    for (int y = 0; y < rep; ++y)
      for (int z = 0; z < rep; ++z)
        for (const auto& b : basis) {
          pos.push_back((x + b[0]) * a + noise(gen));
          pos.push_back((y + b[1]) * a + noise(gen));
          pos.push_back((z + b[2]) * a + noise(gen));
        }
  const auto n = static_cast<int64_t>(pos.size() / 3);
  auto positions = at::from_blob(pos.data(), {n, 3}, at::kDouble).clone();
  return {positions, at::eye(3, at::kDouble) * (a * rep)};
}

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
