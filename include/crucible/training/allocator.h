#pragma once
// Process allocator settings for training (issue 7).

#include <cstddef>
#include <cstdint>

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

/// Replaces LibTorch's CPU allocator with one that keeps freed blocks of
/// 16 MiB or more (rounded up to 2 MiB, 2 MiB aligned, backed by
/// transparent huge pages where Linux allows: madvise MADV_HUGEPAGE, unless
/// the environment sets CRUCIBLE_HUGE_PAGES=0) for reuse, up to half of the
/// physical memory, and passes smaller requests to the previous allocator
/// (issue 19). glibc serves requests above its 32 MiB mmap ceiling with
/// fresh mappings, so each of a large structure's edge-sized temporaries
/// ([E,64] float32 is 176 MB at 16384 Cu atoms) was page-faulted and zeroed
/// by the kernel on every step: 39% of a 16384-atom SchNet training step
/// here. (With a quarter of the memory as the limit, a 16384-atom MACE
/// training step, 13.6 GB at its peak, freed 43 GB of blocks past the limit
/// per run and spent 28% of its time zeroing pages again: perf on an AMD
/// EPYC Zen 5 VM with avx512_bf16, 23 GB.) Cached memory
/// stays resident, as with PyTorch's CUDA caching allocator; on allocation
/// failure the cache is returned and the request retried once, and since
/// Linux overcommits (malloc succeeds, then the machine swaps), a request
/// the kernel could not serve with 1/16 of the physical memory to spare
/// (MemAvailable) first returns cached blocks, the largest first, until
/// bytes_to_yield are freed. Called by tune_allocator_for_training, by the
/// Python module when it loads a model and by the KIM driver's create
/// routine (python3 and lmp: glibc mapped every block over 32 MiB afresh,
/// 1.3-1.6 s of page faults per 16384-atom MACE call); a no-op
/// when the environment sets CRUCIBLE_DEFAULT_MALLOC=1. Huge pages: a
/// 6912-atom SchNet training step 2-7% faster once its blocks are cached
/// (Zen 5 VM, 1 thread); on that VM the first step sometimes spent ~3 s in
/// the kernel zeroing fresh huge pages (1.2 GB, memory the hypervisor had
/// not backed yet), against ~0.5 s with 4 KiB pages. Idempotent and
/// thread-safe; tensors allocated before keep their own deleters.
/// @throws std::bad_alloc from allocations when memory is exhausted.
void install_large_block_cache();

/// The large block cache's rule for a request it cannot serve from cached
/// blocks: the bytes of cached blocks to give back before allocating,
/// `request` + `physical` / 16 - `available` when positive, else 0 (all in
/// bytes). Never throws.
size_t bytes_to_yield(size_t request, size_t available, size_t physical);

/// Bytes of memory available now (/proc/meminfo MemAvailable; physical
/// memory when that is unreadable). Never throws.
int64_t available_memory_bytes();

}  // namespace crucible
