// crucible command-line entry point; see src/cli/.
#include "crucible/cli/cli.h"
#include "crucible/training/allocator.h"
#include "crucible/training/blas_kernels.h"

#include <csignal>

int main(int argc, char** argv) {
  crucible::select_blas_kernels(argc, argv);  // may re-execute once with OPENBLAS_CORETYPE
  crucible::tune_allocator_for_training();  // training and evaluation alike
  // A write past the file-size limit (ulimit -f) fails with EFBIG and is
  // reported like a full disk, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  return crucible::run_cli(argc, argv);
}
