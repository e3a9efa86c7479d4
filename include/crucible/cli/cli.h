#pragma once
// `crucible` command line: train, evaluate.

namespace crucible {

/// Runs the `crucible` command line (subcommands `train`, `evaluate`).
/// Returns the process exit code: 0 on success, 1 on a user error (bad data,
/// bad config; the message is printed to stderr), 2 on an internal error.
int run_cli(int argc, char** argv);

}  // namespace crucible
