// The executables' malloc (issue 19): the build links the configured one
// (CMake CRUCIBLE_MALLOC), and LibTorch's CPU tensors are taken from it.

#include "crucible/training/allocator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstddef>
#include <string>

namespace {

TEST(ActiveMalloc, IsTheOneTheBuildLinked) {
  // CRUCIBLE_MALLOC_USED comes from CMake: "tcmalloc" unless configured
  // with -DCRUCIBLE_MALLOC=system or a sanitizer. A tcmalloc the linker
  // dropped (--as-needed) reads "system" here.
  EXPECT_EQ(std::string(crucible::active_malloc()), CRUCIBLE_MALLOC_USED);
}

// tcmalloc's count of bytes handed out (gperftools' C API, looked up at run
// time so that this file needs no gperftools header); -1 without tcmalloc.
long long tcmalloc_allocated_bytes() {
  using Fn = int (*)(const char*, size_t*);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"));
  size_t value = 0;
  if (fn == nullptr || fn("generic.current_allocated_bytes", &value) == 0) return -1;
  return static_cast<long long>(value);
}

TEST(ActiveMalloc, LibTorchTensorsComeFromTcmalloc) {
  if (std::string(crucible::active_malloc()) != "tcmalloc") GTEST_SKIP() << "built with the system malloc";
  const long long before = tcmalloc_allocated_bytes();
  ASSERT_GE(before, 0);
  // 4 MiB: below the large block cache's 16 MiB, so LibTorch's allocator
  // passes it to malloc.
  const at::Tensor t = at::empty({1024 * 1024}, at::kFloat);
  const long long during = tcmalloc_allocated_bytes();
  EXPECT_GE(during - before, 4LL * 1024 * 1024);
  EXPECT_LT(during - before, 5LL * 1024 * 1024);
}

}  // namespace
