#pragma once
// Process allocator settings for training (issue 7).

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

}  // namespace crucible
