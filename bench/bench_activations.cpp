// Shifted softplus on a SchNet filter-sized tensor ([5888, 64], the pair
// rows of 8 × 32-atom Cu cells at 5 Å): the one-pass loop
// (shifted_softplus_and_sigmoid) against at::softplus − ln 2 and
// at::sigmoid, in float32 and bfloat16 (issue 19). SiLU on the same rows
// (MACE's radial MLP, 64 wide): silu_fused's forward, first and second
// derivative loops against at::silu and autograd's generic ones.
// Run: OMP_NUM_THREADS=1 ./build/bench/bench_activations

#include "crucible/models/shifted_softplus.h"
#include "crucible/models/silu.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

namespace {

at::Tensor filter_rows(int64_t dtype_code) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({5888, 64}, at::kFloat) * 3.0;
  return dtype_code == 0 ? x : x.to(at::kBFloat16);
}

void one_pass(benchmark::State& state) {
  const at::Tensor x = filter_rows(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(crucible::shifted_softplus_and_sigmoid(x));
  state.SetLabel(state.range(0) == 0 ? "float32" : "bfloat16");
}

void aten_ops(benchmark::State& state) {
  const at::Tensor x = filter_rows(state.range(0));
  const double ln2 = std::log(2.0);
  for (auto _ : state) {
    benchmark::DoNotOptimize(at::softplus(x) - ln2);
    benchmark::DoNotOptimize(at::sigmoid(x));
  }
  state.SetLabel(state.range(0) == 0 ? "float32" : "bfloat16");
}

// A force-training pass through one activation: value, its derivative with
// create_graph, then the backward of that derivative (second order).
template <bool Fused>
void silu_second_order(benchmark::State& state) {
  const at::Tensor x0 = filter_rows(state.range(0));
  const at::Tensor w = at::ones_like(x0);
  for (auto _ : state) {
    at::Tensor x = x0.detach().requires_grad_(true);
    const at::Tensor y = Fused ? crucible::silu_fused(x) : at::silu(x);
    const at::Tensor g = torch::autograd::grad({y}, {x}, {w}, true, true)[0];
    benchmark::DoNotOptimize(torch::autograd::grad({g}, {x}, {w})[0]);
  }
  state.SetLabel(state.range(0) == 0 ? "float32" : "bfloat16");
}

}  // namespace

BENCHMARK_TEMPLATE(silu_second_order, true)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(silu_second_order, false)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(one_pass)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(aten_ops)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
