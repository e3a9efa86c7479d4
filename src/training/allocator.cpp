// tune_allocator_for_training (issue 7), active_malloc, available_memory_bytes.

#include "crucible/training/allocator.h"

#include <dlfcn.h>

#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

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

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : INT64_MAX;
}

}  // namespace crucible
