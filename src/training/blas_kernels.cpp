// See include/crucible/training/blas_kernels.h.

#include "crucible/training/blas_kernels.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace crucible {

std::string blas_core_name() {
  using Fn = char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!fn) return "not OpenBLAS";
  const char* name = fn();
  return name ? std::string(name) : std::string("unknown");
}

void select_blas_kernels(int argc, char** argv) {
  (void)argc;
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("CRUCIBLE_BLAS_REEXEC")) return;
  const std::string core = blas_core_name();
  // OpenBLAS's generic x86-64 fallbacks.
  static const char* const kGeneric[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Katmai",
                                         "Coppermine", "Northwood", "Banias", "Atom", "Unknown", "unknown"};
  bool generic = false;
  for (const char* g : kGeneric) generic = generic || core == g;
  if (!generic) return;
  __builtin_cpu_init();
  const char* pick = nullptr;
  if (__builtin_cpu_supports("avx512f")) {
    pick = "SkylakeX";
#if defined(__GNUC__) && __GNUC__ >= 11
    if (__builtin_cpu_supports("avx512bf16")) pick = "Cooperlake";
#endif
  } else if (__builtin_cpu_supports("avx2")) {
    pick = "Haswell";
  }
  if (!pick) return;
  setenv("OPENBLAS_CORETYPE", pick, 1);
  setenv("CRUCIBLE_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // execv failed: carry on with the kernels already loaded.
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace crucible
