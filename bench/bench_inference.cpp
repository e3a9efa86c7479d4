// Inference at MD scale (issue 19): energy, forces and stress of rattled
// fcc Cu cells (5 Å cutoff) through the C++ API, for SchNet (64 features,
// 3 interactions, 20 Gaussians) or MACE (32x0e+32x1o, l ≤ 3, correlation 3,
// 2 interactions), float32, random weights. Per size it prints atoms/s and
// the peak resident memory per atom that the evaluation added (VmHWM after
// the call minus VmRSS before it, peak reset through /proc/self/clear_refs;
// neighbor list and batch are built before; the first, untimed call, so
// give one size per process). One key=value line per size;
// run by bench/run_benchmarks.py.
// --path training times a training step's model work instead: outputs with
// create_graph, then an energy + force loss backward to the parameters.
// --model gemm prints the float32, bfloat16 and float64 rates of a 1024³ matrix
// product; every model line carries hand_flops_per_atom (hand_flops.h).
// Run: ./build/bench/bench_inference [--model schnet|mace|gemm] [--threads N]
//      [--reps 4,8,16,32] [--path inference|training] [--ops K]
//      [--order lattice|shuffled|morton] [--flops 0|1] [--op-shapes 0|1]
//      [--thread-rounds K] [--engine-rounds K] [--mace-size small|medium]
//      [--model-dir DIR] [--dtype float32|float64]
// --order permutes the atoms before the neighbor list: same structure, same
// edges, other indices. shuffled: at random (seed 0), so a receiver's
// neighbors no longer have nearby indices; morton: along a Z-order curve of
// the fractional coordinates (10 bits per axis), so they have nearer ones
// than in lattice order (ASE repeat order). The per-atom cost of each says
// how much of its growth with size is cache locality.
// --flops 0 skips the profiled call that counts a training call's FLOPs
// (for perf record: then every call but the first is a timed one).
// --op-shapes 1 lists --ops per operator and input shapes.
// --thread-rounds K (with --threads N > 1): after the usual figures, K more
// rounds of one call with 1 thread and one with N (at::set_num_threads in
// this process; 1 first in even rounds, N first in odd ones), printed as a
// "threads_side_by_side" line: the median of the K per-round speedups and
// their range. On a VM whose speed
// drifts between runs, one process per thread count (the line above, run
// twice) compared two separate moments; alternating calls compare the same.
// faults_per_call and kernel_share: minor page faults and the kernel's share
// of a timed call; fresh_mb_per_call and moved_mb_per_call: the large block
// cache's newly mapped MiB and idle MiB moved into new blocks per timed call.
// --engine-rounds K: K more rounds of one call through the inference engine
// (MACE: radial splines and fused kernels; SchNet: filter splines) and one
// through the exact path, alternating, as an "engine_side_by_side" line
// (median speedup and range; issue 48).
// --mace-size medium: 128x0e+128x1o, max_ell 3, correlation 3, 2 interactions,
// 89 elements (MACE-MP-0 medium's size), random weights; small: the default.
// --cluster-rounds K: K more rounds of one C++ API call and one
// evaluate_cluster call on the cell cut out as LAMMPS hands it to the KIM
// model (the atoms, contributing, and their periodic images within the
// interaction range + 1 Å of skin as padding; energy, forces, virial; full
// neighbor lists at cutoff + 1 Å built once, as LAMMPS's between rebuilds),
// alternating, as a "cluster_side_by_side" line: the median ratio cluster
// over API per atom, and the floors sum_t work_t / (L · the API's work) by
// atoms, edges and pairs (ClusterResult::layer_*; the periodic cell has
// E / 2 pairs): what the layers' work on padding alone would give (issue 48).
// --model-dir DIR loads a trained or exported model (model.json + model.pt,
// as crucible evaluate does) instead of random weights; --dtype float64
// evaluates in float64 (default float32): bench/run_md_scale.py's
// kim_vs_api lines time LAMMPS/KIM against this for the same model.
// --ops K profiles one more (untimed) call and prints its K operators of the
// largest self time (time inside the op minus its child ops; summed over all
// threads' records, so wall time only where one thread runs), one
// "op name=... self_ms=... calls=..." line each: which parts of a call do not
// gain from threads.

#include "crucible/run/model_io.h"
#include "crucible/data/dataset.h"
#include "crucible/deploy/cluster.h"
#include "crucible/neighbors/neighbor_list.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "crucible/training/allocator.h"
#include "crucible/training/blas_kernels.h"
#include "fcc_cu.h"
#include "hand_flops.h"
#include "crucible/precision/precision.h"
#include "crucible/training/hook.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <sys/resource.h>

namespace {

// This process so far (getrusage): minor page faults and seconds in the kernel.
struct Usage {
  long minor_faults;
  double kernel_seconds;
  crucible::LargeBlockCacheStats cache;  // zeros when the cache is off
};
Usage self_usage() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  Usage out{u.ru_minflt, static_cast<double>(u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_stime.tv_usec), {}};
  crucible::large_block_cache_stats(&out.cache);
  return out;
}

// Linux: kB of the named /proc/self/status line ("VmRSS", "VmHWM").
double status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line)) {
    if (line.compare(0, k.size(), k) == 0) return std::atof(line.c_str() + k.size());
  }
  return 0.0;
}

void reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

/// K rounds of a(), b() in alternating order (a first in even rounds, b in
/// odd ones), each returning its seconds: the two side by side.
void alternate(int rounds, const std::function<double()>& a, const std::function<double()>& b, std::vector<double>& ta,
               std::vector<double>& tb, std::vector<double>& ratio_b_over_a) {
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      ta.push_back(a());
      tb.push_back(b());
    } else {
      tb.push_back(b());
      ta.push_back(a());
    }
    ratio_b_over_a.push_back(tb.back() / ta.back());
  }
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t p = 0;
  while (p < s.size()) {
    const size_t k = s.find(',', p);
    out.push_back(std::atoi(s.substr(p, k - p).c_str()));
    p = k == std::string::npos ? s.size() : k + 1;
  }
  return out;
}

// Self time per operator name, in ms, and the number of calls, from the
// legacy profiler's push/pop records (nested per thread).
// With `shapes`, an op's key is its name and its inputs' shapes.
std::map<std::string, std::pair<double, int>> self_times(
    const std::vector<std::vector<torch::autograd::profiler::LegacyEvent>>& threads, bool shapes) {
  using torch::autograd::profiler::EventKind;
  using torch::autograd::profiler::LegacyEvent;
  std::map<std::string, std::pair<double, int>> out;
  for (const auto& events : threads) {
    struct Open {
      const LegacyEvent* push;
      double child_us;
    };
    std::vector<Open> stack;
    for (const auto& ev : events) {
      if (ev.kind() == EventKind::PushRange) {
        stack.push_back({&ev, 0.0});
      } else if (ev.kind() == EventKind::PopRange && !stack.empty()) {
        const Open o = stack.back();
        stack.pop_back();
        const double total = o.push->cpuElapsedUs(ev);
        std::string key = o.push->name();
        if (shapes) {
          for (const auto& dims : o.push->shapes()) {
            key += " [";
            for (size_t d = 0; d < dims.size(); ++d) key += (d ? "," : "") + std::to_string(dims[d]);
            key += "]";
          }
        }
        auto& entry = out[key];
        entry.first += (total - o.child_us) * 1e-3;
        entry.second += 1;
        if (!stack.empty()) stack.back().child_us += total;
      }
    }
  }
  return out;
}

// Permutation [N] that sorts positions [N,3] (Å) in a cell [3,3] (rows are
// lattice vectors) along a Z-order (Morton) curve of their fractional
// coordinates wrapped into [0, 1), 10 bits per axis.
at::Tensor morton_order(const at::Tensor& positions, const at::Tensor& cell) {
  const at::Tensor frac = at::matmul(positions.to(at::kDouble), at::inverse(cell.to(at::kDouble)));
  const at::Tensor q = ((frac - frac.floor()) * 1024.0).floor().clamp(0, 1023).to(at::kLong).contiguous();
  const int64_t n = q.size(0);
  std::vector<int64_t> code(n);
  const int64_t* p = q.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = 0;
    for (int b = 0; b < 10; ++b)
      for (int a = 0; a < 3; ++a) c |= ((p[3 * i + a] >> b) & 1) << (3 * b + a);
    code[i] = c;
  }
  return at::argsort(at::tensor(code, at::kLong));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace crucible;
  select_blas_kernels(argc, argv);  // as crucible's main does
  tune_allocator_for_training();
  std::string model_name = "schnet", path = "inference";
  std::string atom_order = "lattice";
  int threads = 1, top_ops = 0, count_flops = 1, op_shapes = 0, thread_rounds = 0, engine_rounds = 0, cluster_rounds = 0;
  std::string mace_size = "small", model_dir;
  at::ScalarType dtype = at::kFloat;
  std::vector<int> reps = {4, 8, 16, 32};
  for (int k = 1; k + 1 < argc; k += 2) {
    const std::string key = argv[k], value = argv[k + 1];
    if (key == "--model") model_name = value;
    else if (key == "--threads") threads = std::atoi(value.c_str());
    else if (key == "--reps") reps = parse_list(value);
    else if (key == "--path") path = value;
    else if (key == "--ops") top_ops = std::atoi(value.c_str());
    else if (key == "--flops") count_flops = std::atoi(value.c_str());
    else if (key == "--op-shapes") op_shapes = std::atoi(value.c_str());
    else if (key == "--thread-rounds") thread_rounds = std::atoi(value.c_str());
    else if (key == "--engine-rounds") engine_rounds = std::atoi(value.c_str());
    else if (key == "--model-dir") model_dir = value;
    else if (key == "--cluster-rounds") cluster_rounds = std::atoi(value.c_str());
    else if (key == "--dtype") {
      if (value != "float32" && value != "float64") {
        std::fprintf(stderr, "--dtype: expected float32 or float64, got '%s'\n", value.c_str());
        return 1;
      }
      dtype = value == "float64" ? at::kDouble : at::kFloat;
    }
    else if (key == "--mace-size") {
      if (value != "small" && value != "medium") {
        std::fprintf(stderr, "--mace-size: expected small or medium, got '%s'\n", value.c_str());
        return 1;
      }
      mace_size = value;
    }
    else if (key == "--order") {
      if (value != "lattice" && value != "shuffled" && value != "morton") {
        std::fprintf(stderr, "--order: expected lattice, shuffled or morton, got '%s'\n", value.c_str());
        return 1;
      }
      atom_order = value;
    } else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 1;
    }
  }
  at::set_num_threads(threads);
  if (model_name == "gemm") {  // the machine's matrix-product rate, for the FLOP/s fractions
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kDouble}) {
      const int64_t m = 1024;
      const at::Tensor a = at::randn({m, m}).to(dt), b = at::randn({m, m}).to(dt);
      double best = 1e30;
      for (int r = 0; r < 5; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        (void)at::mm(a, b);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("gemm dtype=%s threads=%d m=n=k=%lld gflops=%.1f malloc=%s\n", dt == at::kFloat ? "float32" : (dt == at::kDouble ? "float64" : "bfloat16"),
                  threads, static_cast<long long>(m), 2.0 * m * m * m / best / 1e9, active_malloc());
    }
    return 0;
  }
  at::manual_seed(0);
  std::shared_ptr<EnergyModel> model;
  if (!model_dir.empty()) {
    model = load_model(model_dir).model;
    model_name = dynamic_cast<MaceImpl*>(model.get()) ? "mace" : "schnet";
  } else if (model_name == "schnet") {
    SchNetOptions so;
    so.cutoff = 5.0;
    model = std::make_shared<SchNetImpl>(so);
  } else if (model_name == "mace") {
    MaceOptions mo;
    mo.atomic_numbers = {29};
    mo.avg_num_neighbors = 42.0;
    if (mace_size == "medium") {  // MACE-MP-0 "medium"'s size: 128 channels, l <= 3, ν = 3, 89 elements
      mo.hidden_irreps = "128x0e+128x1o";
      mo.max_ell = 3;
      mo.correlation = 3;
      mo.num_interactions = 2;
      mo.atomic_numbers.clear();
      for (int64_t z = 1; z <= 89; ++z) mo.atomic_numbers.push_back(z);
    }
    model = std::make_shared<MaceImpl>(mo);
  } else {
    std::fprintf(stderr, "--model schnet|mace\n");
    return 1;
  }
  model->module().to(dtype);
  for (int rep : reps) {
    Structure s = bench::fcc_cu_structure(rep);
    if (atom_order == "shuffled") {
      const at::Tensor perm = at::randperm(s.num_atoms(), at::TensorOptions(at::kLong));
      s.positions = s.positions.index_select(0, perm);
    } else if (atom_order == "morton") {
      s.positions = s.positions.index_select(0, morton_order(s.positions, s.cell));
    }
    const int64_t n = s.num_atoms();
    AtomicDataset ds({s}, model->cutoff());
    const Batch batch = ds.collate({0}).to(at::kCPU, dtype);
    ComputeOptions co;
    co.forces = true;
    co.stress = true;
    co.training = path == "training";
    const int calls = n <= 2048 ? 5 : (n <= 16384 ? 3 : 2);
    auto evaluate = [&] {
      ModelOutputs out = compute_outputs(*model, batch, co);
      if (co.training) {  // one training step's work: a force loss back to the parameters
        // Into the parameters only, as the training loop does (backward_into).
        crucible::backward_into(out.energy.pow(2).sum() + out.forces.pow(2).sum(), crucible::trainable_parameters(*model));
        model->module().zero_grad();
      }
    };
    // Peak of the first (untimed) call: memory a fresh process needs. Later
    // calls reuse the heap it left, so measure it with one size per process.
    const double rss0 = status_kb("VmRSS");
    reset_peak();
    evaluate();
    const double peak_kb = status_kb("VmHWM") - rss0;
    const Usage before = self_usage();
    double best = 1e30;
    for (int c = 0; c < calls; ++c) {
      const auto t0 = std::chrono::steady_clock::now();
      evaluate();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const Usage after = self_usage();
    const double faults_per_call = static_cast<double>(after.minor_faults - before.minor_faults) / calls;
    const double kernel_share = (after.kernel_seconds - before.kernel_seconds) / calls / best;
    // Large block cache: MiB newly mapped, and MiB of idle blocks moved, per timed call.
    const double fresh_mb = static_cast<double>(after.cache.fresh_bytes - before.cache.fresh_bytes) / calls / (1 << 20);
    const double moved_mb = static_cast<double>(after.cache.moved_bytes - before.cache.moved_bytes) / calls / (1 << 20);
    // FLOPs of one call as LibTorch's profiler counts them (matrix products,
    // element-wise add/mul; the hand-written edge kernels are not counted,
    // so the achieved rate below is a lower bound). Untimed; training path only.
    // Not above 8192 atoms: the profiler's records of a 131072-atom inference
    // call, and of a 16384-atom MACE training call, filled 24 GB.
    double gflop = std::nan("");
    if (co.training && n <= 8192 && count_flops != 0) {
      gflop = 0.0;
      namespace prof = torch::autograd::profiler;
      prof::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(
          torch::profiler::impl::ProfilerState::CPU, /*report_input_shapes=*/true, /*profile_memory=*/false,
          /*with_stack=*/false, /*with_flops=*/true));
      evaluate();
      for (auto& thread_events : prof::disableProfilerLegacy())
        for (auto& ev : thread_events) gflop += static_cast<double>(ev.flops()) * 1e-9;
    }
    // Issue 48: the call's FLOPs per atom counted by hand (hand_flops.h).
    const double edges_per_atom = static_cast<double>(batch.num_edges()) / static_cast<double>(n);
    double hand_flops = std::nan("");
    if (const auto* m = dynamic_cast<const MaceImpl*>(model.get())) hand_flops = bench::mace_engine_flops_per_atom(m->options(), edges_per_atom);
    std::string hand_split = "none";  // SchNet: the hand count's shares by atoms, edges and pairs (the kim floor's weights)
    if (const auto* m = dynamic_cast<const SchNetImpl*>(model.get())) {
      const bench::SchNetFlops split = bench::schnet_flops_split(m->options(), edges_per_atom, m->filter_spline_enabled());
      hand_flops = split.total();
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.4f,%.4f,%.4f", split.atoms / hand_flops, split.edges / hand_flops,
                    split.pairs / hand_flops);
      hand_split = buf;
    }
    std::printf("model=%s dtype=%s path=%s order=%s threads=%d atoms=%lld edges=%lld atoms_per_s=%.0f us_per_atom=%.2f "
                "peak_kb_per_atom=%.2f faults_per_call=%.0f kernel_share=%.3f fresh_mb_per_call=%.0f moved_mb_per_call=%.0f "
                "profiled_gflop=%.3f achieved_gflops=%.2f hand_flops_per_atom=%.0f hand_shares_atoms_edges_pairs=%s\n",
                model_name.c_str(), dtype == at::kDouble ? "float64" : "float32", path.c_str(), atom_order.c_str(), threads, static_cast<long long>(n),
                static_cast<long long>(batch.num_edges()), n / best, 1e6 * best / n, peak_kb / n, faults_per_call, kernel_share, fresh_mb, moved_mb, gflop,
                gflop / best, hand_flops, hand_split.c_str());
    std::fflush(stdout);
    if (thread_rounds > 0 && threads > 1) {
      auto timed = [&](int t) {
        at::set_num_threads(t);
        const auto t0 = std::chrono::steady_clock::now();
        evaluate();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      std::vector<double> one, many, ratio;  // N, 1, 1, N, N, 1, ...: neither goes first every time
      alternate(thread_rounds, [&] { return timed(threads); }, [&] { return timed(1); }, many, one, ratio);
      at::set_num_threads(threads);
      std::printf("threads_side_by_side model=%s path=%s atoms=%lld rounds=%d threads=%d us_per_atom_1=%.2f "
                  "us_per_atom_n=%.2f speedup_median=%.3f speedup_min=%.3f speedup_max=%.3f\n",
                  model_name.c_str(), path.c_str(), static_cast<long long>(n), thread_rounds, threads,
                  1e6 * median(one) / n, 1e6 * median(many) / n, median(ratio),
                  *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()));
      std::fflush(stdout);
    }
    if (engine_rounds > 0 && (model_name == "mace" || model_name == "schnet")) {
      // Issue 48: the inference engine (MACE's radial splines, fused
      // kernels; SchNet's filter splines) against the exact path of the
      // same model, alternating call by call.
      auto* mace = dynamic_cast<MaceImpl*>(model.get());
      auto* schnet = dynamic_cast<SchNetImpl*>(model.get());
      auto set_engine = [&](bool on) {
        if (mace) mace->set_radial_spline(on);
        if (schnet) schnet->set_filter_spline(on);
      };
      auto timed = [&](bool engine) {
        set_engine(engine);
        const auto t0 = std::chrono::steady_clock::now();
        evaluate();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      timed(true);  // the tables are built on the first engine call
      std::vector<double> eng, ref, ratio;
      alternate(engine_rounds, [&] { return timed(true); }, [&] { return timed(false); }, eng, ref, ratio);
      set_engine(true);
      const std::string label = mace ? "mace_" + mace_size : "schnet";
      std::printf("engine_side_by_side model=%s path=%s atoms=%lld rounds=%d threads=%d us_per_atom_engine=%.2f "
                  "us_per_atom_exact=%.2f speedup_median=%.3f speedup_min=%.3f speedup_max=%.3f hand_flops_per_atom=%.0f\n",
                  label.c_str(), path.c_str(), static_cast<long long>(n), engine_rounds, threads,
                  1e6 * median(eng) / n, 1e6 * median(ref) / n, median(ratio),
                  *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()), hand_flops);
      std::fflush(stdout);
    }
    if (cluster_rounds > 0) {
      // The cell as LAMMPS's domain of one process: images within range + skin of the cubic cell.
      const double side = s.cell[0][0].item<double>(), reach = model->interaction_range() + 1.0;
      const int m = static_cast<int>(std::ceil(reach / side));
      std::vector<at::Tensor> parts{s.positions};
      std::vector<int64_t> owned{n};
      for (int i = -m; i <= m; ++i)
        for (int j = -m; j <= m; ++j)
          for (int k = -m; k <= m; ++k) {
            if (i == 0 && j == 0 && k == 0) continue;
            const at::Tensor image = s.positions + at::tensor(std::vector<double>{i * side, j * side, k * side}, at::kDouble);
            const at::Tensor inside = ((image > -reach) & (image < side + reach)).all(1);
            parts.push_back(image.index({inside}));
          }
      const at::Tensor cluster = at::cat(parts);
      const int64_t total = cluster.size(0);
      const at::Tensor z = at::full({total}, 29, at::kLong);
      const at::Tensor contributing = at::arange(total, at::kLong) < n;
      // Full lists at cutoff + skin built once, as LAMMPS keeps its lists between rebuilds.
      const ParticleLists lists = particle_lists(
          build_neighbor_list(cluster, at::zeros({3, 3}, at::kDouble), {false, false, false}, model->cutoff() + 1.0),
          total);
      const NeighborListSource source = lists.source();
      ClusterOptions options;
      options.virial = true;
      ClusterResult last;
      auto timed_cluster = [&] {
        const auto t0 = std::chrono::steady_clock::now();
        last = evaluate_cluster(*model, cluster, z, contributing, source, options);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      auto timed_api = [&] {
        const auto t0 = std::chrono::steady_clock::now();
        evaluate();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      timed_cluster();
      std::vector<double> api, clu, ratio;
      alternate(cluster_rounds, timed_api, timed_cluster, api, clu, ratio);
      // Floors by atoms, edges and pairs (bench/run_md_scale.py kim_floors): the cluster's
      // per-layer work over L times the periodic cell's (pairs = edges / 2 there).
      auto floor_of = [&](const std::vector<int64_t>& v, double api_work) {
        double work = 0;
        for (int64_t x : v) work += static_cast<double>(x);
        return v.empty() ? std::nan("") : work / (static_cast<double>(v.size()) * api_work);
      };
      const auto api_edges = static_cast<double>(batch.num_edges());
      const double floor = floor_of(last.layer_nodes, static_cast<double>(n));
      const double floor_edges = floor_of(last.layer_edges, api_edges);
      const double floor_pairs = floor_of(last.layer_pairs, api_edges / 2);
      std::printf("cluster_side_by_side model=%s dtype=%s atoms=%lld particles=%lld evaluated=%lld rounds=%d "
                  "us_per_atom_api=%.2f us_per_atom_cluster=%.2f ratio_median=%.3f ratio_min=%.3f ratio_max=%.3f "
                  "floor_atoms=%.3f floor_edges=%.3f floor_pairs=%.3f\n",
                  model_name.c_str(), dtype == at::kDouble ? "float64" : "float32", static_cast<long long>(n),
                  static_cast<long long>(total), static_cast<long long>(last.evaluated_atoms), cluster_rounds,
                  1e6 * median(api) / n, 1e6 * median(clu) / n, median(ratio),
                  *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()), floor,
                  floor_edges, floor_pairs);
      std::fflush(stdout);
    }
    if (top_ops > 0) {
      namespace prof = torch::autograd::profiler;
      prof::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU,
                                                                         /*report_input_shapes=*/op_shapes != 0));
      const auto t0 = std::chrono::steady_clock::now();
      evaluate();
      const double wall_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const auto times = self_times(prof::disableProfilerLegacy(), op_shapes != 0);
      std::vector<std::pair<double, std::string>> order;
      for (const auto& [name, t] : times) order.emplace_back(t.first, name);
      std::sort(order.rbegin(), order.rend());
      std::printf("profiled call: %.1f ms wall (with the profiler's overhead)\n", wall_ms);
      for (size_t k = 0; k < order.size() && k < static_cast<size_t>(top_ops); ++k) {
        std::printf("op name=%s self_ms=%.1f calls=%d\n", order[k].second.c_str(), order[k].first,
                    times.at(order[k].second).second);
      }
    }
  }
  return 0;
}
