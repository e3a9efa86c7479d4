#pragma once
// How many CPU threads a training run uses when training.num_threads is 0
// ("auto", issue 19 deliverable 4): the faster of 1 thread and every core
// this worker may use, measured on the run's own first batch before the
// first step. Design: docs/thread_choice.md.

#include "crucible/data/batch.h"
#include "crucible/models/energy_model.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// Cores this process may run on: its CPU affinity mask
/// (sched_getaffinity), lowered to the cgroup v2 CPU quota
/// (/sys/fs/cgroup/cpu.max, rounded up) where one is set; at least 1.
int available_cpu_cores();

/// Worker processes of a data-parallel run on this machine, from the
/// launcher's variables: LOCAL_WORLD_SIZE (torchrun),
/// OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI), SLURM_NTASKS_PER_NODE (leading
/// integer); else the whole world (WORLD_SIZE, OMPI_COMM_WORLD_SIZE,
/// SLURM_NTASKS), as `crucible train --nproc` starts every worker here;
/// else 1.
int local_worker_count();

/// OMP_NUM_THREADS as a positive integer; nullopt where unset or not one.
std::optional<int> omp_num_threads_from_environment();

/// One candidate's measurement.
struct ThreadTiming {
  int threads = 1;          ///< intra-op threads it ran with.
  double ms_per_pass = 0;   ///< median wall time of one pass, ms.
};

/// The thread count chosen, and why.
struct ThreadChoice {
  int threads = 1;                   ///< what at::set_num_threads now holds.
  /// How it was chosen: "measured", "one core" (choose_thread_count), or
  /// resolve_thread_count's "training.num_threads", "auto: OMP_NUM_THREADS",
  /// "auto: one core per worker", "auto: this worker's cores".
  std::string source;
  std::vector<ThreadTiming> timings;  ///< candidates in the order run (source "measured").
  /// One line for the run header, e.g. "2 (auto, the faster on the first
  /// batch: 1 thread 41.0 ms/batch, 2 threads 27.3 ms/batch)", or
  /// "1 (auto: OMP_NUM_THREADS)" when not measured.
  std::string describe() const;
};

/// Options of choose_thread_count.
struct ThreadChoiceOptions {
  int max_threads = 1;   ///< the other candidate besides 1 (>= 1); 1 = nothing to measure.
  int reps = 4;          ///< least timed passes per candidate (>= 1).
  int max_reps = 100;    ///< most timed passes per candidate (>= reps).
  /// Passes continue (up to max_reps) until the timed ones took this long
  /// per candidate, ms: short passes are noisy. Default 500.
  double target_ms = 500;
  /// More threads are chosen only if their median pass is this many times
  /// faster than one thread's (> 0): ties and noise keep 1 thread, which
  /// is the safe choice on a machine whose cores are busy. Default 1.05:
  /// with 1.1, MACE kept 1 thread on a VM where its first batch ran 1.07×
  /// faster on 2 and the whole run 1.09× (docs/thread_choice.md).
  double min_speedup = 1.05;
  /// Milliseconds now; empty = std::chrono::steady_clock. Tests give a clock
  /// the pass advances, so the rule is tested without timing noise.
  std::function<double()> clock_ms;
};

/// Times `pass` with 1 thread and with max_threads, in blocks 1, N, 1, N:
/// each block one untimed warm-up, then passes until the block has half of
/// `reps` and took half of target_ms (at most half of max_reps). Sets at::set_num_threads to the candidate
/// with the lower median (max_threads only if min_speedup times faster) and
/// returns it. With max_threads 1 nothing runs and 1 is set. `pass` must not
/// change training state (see training_pass). @throws std::invalid_argument
/// on max_threads < 1, reps < 1, max_reps < reps or min_speedup <= 0;
/// whatever `pass` throws.
ThreadChoice choose_thread_count(const std::function<void()>& pass, const ThreadChoiceOptions& options);

/// One training step's model work on `batch` (on the model's device and
/// dtype): compute_outputs with create_graph, then the backward of
/// Σ energy² + Σ forces² to the parameters, as a force-trained step does.
/// Runs with denormals flushed to zero, as training does (compute_outputs
/// and backward_into flush; common/denormals.h). Parameters are not
/// changed, and each parameter's gradient is put back
/// as it was (undefined stays undefined), so the pass leaves no trace in
/// the run. The model's training mode is left as it is.
std::function<void()> training_pass(EnergyModel& model, const Batch& batch);

}  // namespace crucible
