// tune_allocator_for_training (issue 7).

#include "crucible/training/allocator.h"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace crucible {

void tune_allocator_for_training() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* keep = std::getenv("CRUCIBLE_DEFAULT_MALLOC");
    if (keep && std::strcmp(keep, "1") == 0) return;
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);  // glibc's maximum on 64-bit
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    // 16 MiB: with 64 or 512 MiB set at run time, resident memory crept up
    // step after step on a small model (bench_hook_dispatch).
    mallopt(M_TOP_PAD, 16 * 1024 * 1024);
#endif
    install_large_block_cache();
  });
}

const char* active_malloc() {
  // tcmalloc exports malloc as an alias of tc_malloc (one address).
  void* m = dlsym(RTLD_DEFAULT, "malloc");
  void* tc = dlsym(RTLD_DEFAULT, "tc_malloc");
  return m != nullptr && m == tc ? "tcmalloc" : "system";
}

}  // namespace crucible
