// crucible command-line entry point; see src/cli/.
#include "crucible/cli/cli.h"
#include "crucible/training/allocator.h"

int main(int argc, char** argv) {
  crucible::tune_allocator_for_training();  // training and evaluation alike
  return crucible::run_cli(argc, argv);
}
