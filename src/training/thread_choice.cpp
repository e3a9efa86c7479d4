// training.num_threads = 0: the faster of 1 thread and all of this worker's
// cores, measured on the run's first batch (issue 19, deliverable 4).

#include "crucible/training/thread_choice.h"
#include "crucible/precision/precision.h"
#include "crucible/training/hook.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace crucible {

namespace {

/// The leading positive integer of environment variable `name`, if any
/// ("2(x3)" → 2, as SLURM writes SLURM_NTASKS_PER_NODE).
std::optional<int> positive_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || n < 1 || n > 1 << 20) return std::nullopt;
  return static_cast<int>(n);
}

/// ceil(quota / period) of cgroup v2's cpu.max ("max 100000" = none).
std::optional<int> cgroup_cpu_quota() {
  std::ifstream in("/sys/fs/cgroup/cpu.max");
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  const double q = std::atof(quota.c_str());
  if (q <= 0) return std::nullopt;
  return std::max(1, static_cast<int>(std::ceil(q / period)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int available_cpu_cores() {
  int cores = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores < 1) cores = static_cast<int>(std::thread::hardware_concurrency());
  if (const auto quota = cgroup_cpu_quota()) cores = std::min(cores, *quota);
  return std::max(1, cores);
}

int local_worker_count() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "WORLD_SIZE",
                           "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    if (const auto n = positive_env(name)) return *n;
  }
  return 1;
}

std::optional<int> omp_num_threads_from_environment() { return positive_env("OMP_NUM_THREADS"); }

std::string ThreadChoice::describe() const {
  if (source != "measured") return fmt::format("{} ({})", threads, source);
  std::string what;
  for (const auto& t : timings) {
    what += fmt::format("{}{} thread{} {:.1f} ms/batch", what.empty() ? "" : ", ", t.threads,
                        t.threads == 1 ? "" : "s", t.ms_per_pass);
  }
  return fmt::format("{} (auto, the faster on the first batch: {})", threads, what);
}

ThreadChoice choose_thread_count(const std::function<void()>& pass, const ThreadChoiceOptions& options) {
  if (options.max_threads < 1) {
    throw std::invalid_argument(fmt::format("choose_thread_count: max_threads must be >= 1, got {}", options.max_threads));
  }
  if (options.reps < 1 || options.max_reps < options.reps) {
    throw std::invalid_argument(fmt::format("choose_thread_count: need 1 <= reps <= max_reps, got reps {} and max_reps {}",
                                            options.reps, options.max_reps));
  }
  if (!(options.min_speedup > 0)) {
    throw std::invalid_argument(fmt::format("choose_thread_count: min_speedup must be > 0, got {}", options.min_speedup));
  }
  ThreadChoice choice;
  at::set_num_threads(1);
  if (options.max_threads == 1) {
    choice.source = "one core";
    return choice;
  }
  choice.source = "measured";
  // Blocks 1, N, 1, N: switching the thread count every pass would make
  // each N-thread pass wake the pool's idle threads, so each block runs on
  // one setting after its own warm-up; the repeat evens out drift.
  const std::vector<int> candidates{1, options.max_threads};
  std::vector<std::vector<double>> ms(candidates.size());
  for (int block = 0; block < 2 * static_cast<int>(candidates.size()); ++block) {
    const size_t k = static_cast<size_t>(block) % candidates.size();
    at::set_num_threads(candidates[k]);
    pass();  // warm-up
    double spent = 0;
    for (int n = 0; n < (options.max_reps + 1) / 2; ++n) {
      if (n >= (options.reps + 1) / 2 && spent >= 0.5 * options.target_ms) break;
      const auto now = [&] {
        return options.clock_ms ? options.clock_ms()
                                : std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count();
      };
      const double t0 = now();
      pass();
      const double t = now() - t0;
      ms[k].push_back(t);
      spent += t;
    }
  }
  for (size_t k = 0; k < candidates.size(); ++k) choice.timings.push_back({candidates[k], median(ms[k])});
  const double one = choice.timings[0].ms_per_pass, many = choice.timings[1].ms_per_pass;
  choice.threads = many * options.min_speedup < one ? options.max_threads : 1;
  at::set_num_threads(choice.threads);
  return choice;
}

std::function<void()> training_pass(EnergyModel& model, const Batch& batch) {
  return [&model, batch]() {
    const auto params = model.module().parameters();
    std::vector<at::Tensor> saved;
    saved.reserve(params.size());
    for (const auto& p : params) saved.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    ComputeOptions co;
    co.forces = true;
    co.training = true;
    {
      const ModelOutputs out = compute_outputs(model, batch, co);
      // As training does: into the parameters that require grad (a frozen one
      // listed would be an error).
      backward_into(out.energy.pow(2).sum() + out.forces.pow(2).sum(), trainable_parameters(model));
    }
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor p = params[k];
      p.mutable_grad() = saved[k];
    }
  };
}

}  // namespace crucible
