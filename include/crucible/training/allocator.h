#pragma once
// Process allocator settings for training (issue 7).

#include <cstddef>
#include <cstdint>
#include <string>
#include <optional>

namespace crucible {

/// Keeps freed memory in the process instead of returning it to the kernel
/// after every step (glibc: M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 2 GiB,
/// M_TOP_PAD 16 MiB). LibTorch's CPU allocator takes every tensor from
/// malloc; with glibc's defaults each edge-sized temporary ([E,64] float32,
/// ~3 MB for 8 Cu structures) is mmap'd, page-faulted, zeroed and unmapped
/// again, which cost a third of a SchNet force-training step here
/// (bench_schnet_training 26 → 38 structures/s). Resident memory then stays
/// at its peak instead of shrinking between steps, as with PyTorch's caching
/// allocators. Call it first thing in main (as `crucible` and the benchmarks
/// do): applied after much has been allocated, glibc let resident memory
/// creep up over thousands of steps in one measurement. TrainingStrategy's
/// constructor calls it too, for embedders that did not. Idempotent; a no-op without glibc or when the environment sets
/// CRUCIBLE_DEFAULT_MALLOC=1. Never throws.
void tune_allocator_for_training();

/// The malloc this process runs on: "tcmalloc" when malloc is gperftools'
/// tcmalloc (the crucible executables link it, CMake option CRUCIBLE_MALLOC;
/// LibTorch's CPU tensors then come from it), else "system" (glibc's, or a
/// sanitizer's). Decided by whether the malloc symbol the process resolves
/// is tcmalloc's tc_malloc. With tcmalloc, tune_allocator_for_training's
/// mallopt settings are no-ops (tcmalloc's mallopt ignores them) and the
/// large block cache below still keeps the blocks of 16 MiB or more.
/// Printed next to the benchmarks' figures. Never throws.
const char* active_malloc();

/// Replaces LibTorch's CPU allocator (Linux) with one that keeps freed
/// blocks of 16 MiB or more (rounded up to 2 MiB, 2 MiB aligned, mapped
/// with mmap and backed by transparent huge pages where Linux allows:
/// madvise MADV_HUGEPAGE, unless the environment sets CRUCIBLE_HUGE_PAGES=0)
/// for reuse, up to half of the physical memory, and passes smaller
/// requests to the previous allocator (issue 19). glibc serves requests
/// above its 32 MiB mmap ceiling with fresh mappings, so each of a large
/// structure's edge-sized temporaries ([E,64] float32 is 176 MB at 16384 Cu
/// atoms) was page-faulted and zeroed by the kernel on every step: 39% of a
/// 16384-atom SchNet training step here, and 1.3-1.6 s of a 7.3-8.0 s
/// 16384-atom MACE call in python3 (AMD EPYC Zen 5 VM, avx512_bf16).
///
/// A request is served from the smallest idle block that holds it, cut to
/// its size (the rest stays idle). When no idle block is large enough, a
/// new mapping is made and the idle blocks, the largest first, are moved
/// into it with mremap (their pages change address: no copy, no page
/// fault) until it is full (the CPU counterpart of PyTorch's expandable
/// segments for CUDA, which remap physical pages instead of caching whole
/// blocks); only the bytes the idle blocks lack are new. So the cache
/// never maps memory while it holds idle blocks, and the memory it holds
/// peaks where the tensors alive at once peak: a 131072-atom MACE KIM run
/// (float64) peaked at 13.2 GiB, against 12.7 with glibc alone and 20.2
/// with the earlier cache, which reused only whole idle blocks of up to
/// 1.5× the request. Blocks are tracked as pieces that each lie in one
/// kernel mapping, since kernels before 6.17 move only such ranges.
/// Cached memory stays resident between calls, as with PyTorch's CUDA
/// caching allocator; when a new mapping fails, the idle blocks are
/// unmapped and the mapping retried once.
///
/// Medium blocks, 16 KiB to 16 MiB: each freed one is kept in a list per
/// 4 KiB size class (up to 64 MiB idle in all) and handed out again, the
/// last freed first, for a request of its class; the others come from the
/// previous allocator. The inference path's edge chunks allocate and free
/// the same few sizes thousands of times per call, which glibc's malloc
/// (the host's in LAMMPS and Python) served with ~5% of a 16384-atom
/// SchNet KIM step.
///
/// Called by tune_allocator_for_training, by the Python module when it
/// loads a model and by the KIM driver's create routine; a no-op when the
/// environment sets CRUCIBLE_DEFAULT_MALLOC=1 or off Linux. Huge pages: a
/// 6912-atom SchNet training step 2-7% faster once its blocks are cached
/// (Zen 5 VM, 1 thread); on that VM the first step sometimes spent ~3 s in
/// the kernel zeroing fresh huge pages (1.2 GB, memory the hypervisor had
/// not backed yet), against ~0.5 s with 4 KiB pages. Idempotent and
/// thread-safe; tensors allocated before keep their own deleters.
/// @throws std::bad_alloc from allocations when memory is exhausted.
void install_large_block_cache();

/// Bytes of memory available now: the smaller of /proc/meminfo
/// MemAvailable (physical memory when that is unreadable) and what the
/// process's memory cgroup still allows (cgroup_available_bytes). Never throws.
int64_t available_memory_bytes();

/// What the memory cgroups of this process still allow, in bytes: the
/// smallest limit - (usage - inactive file pages) over the process's cgroup
/// and its parents, cgroup v2 (memory.max, memory.current, memory.stat
/// inactive_file) or v1 (memory.limit_in_bytes, memory.usage_in_bytes,
/// total_inactive_file); nullopt when no cgroup sets a limit. The paths are
/// parameters for tests. Never throws.
std::optional<int64_t> cgroup_available_bytes(const std::string& proc_self_cgroup = "/proc/self/cgroup",
                                              const std::string& root = "/sys/fs/cgroup");

/// What the large block cache holds and has done, in bytes (all multiples
/// of 2 MiB) since it was installed.
struct LargeBlockCacheStats {
  size_t live_bytes = 0;    ///< in blocks that tensors use now
  size_t cached_bytes = 0;  ///< in idle blocks
  size_t fresh_bytes = 0;   ///< newly mapped (page faults when first touched)
  size_t moved_bytes = 0;   ///< of idle blocks moved into new mappings
  size_t moved_pieces = 0;  ///< mremap calls that moved them
};

/// Copies the large block cache's figures into `out` and returns true;
/// returns false (and leaves `out` alone) when the cache is not installed.
/// Never throws.
bool large_block_cache_stats(LargeBlockCacheStats* out);

/// Unmaps every idle block of the large block cache and frees its idle
/// medium blocks (its memory goes back to the kernel; the next large
/// requests page-fault again), like PyTorch's
/// torch.cuda.empty_cache, and returns the bytes unmapped (0 when the
/// cache is not installed). Python: crucible.empty_cache(). Never throws.
size_t empty_large_block_cache();

}  // namespace crucible
