// crucible command-line entry point; see src/cli/.
#include "crucible/cli/cli.h"

int main(int argc, char** argv) { return crucible::run_cli(argc, argv); }
