#pragma once
// `crucible` command line: train, evaluate, spec, config.

namespace crucible {

/// Exit codes of the `crucible` command (README "Exit codes").
inline constexpr int kExitOk = 0;              ///< finished.
inline constexpr int kExitBadInput = 1;        ///< bad config, data or usage (message names it).
inline constexpr int kExitInternal = 2;        ///< internal error (a bug: please report).
inline constexpr int kExitTrainingFault = 3;   ///< training stopped by a fault (non-finite loss,
                                               ///< no progress, a failed write), checkpoint named.
inline constexpr int kExitSignalBase = 128;    ///< stopped by signal s: 128 + s (SIGINT 130, SIGTERM 143).

/// Runs the `crucible` command line (subcommands `train`, `evaluate`, ...).
/// Returns the process exit code (kExit*): a run stopped by SIGINT/SIGTERM
/// after writing its checkpoint returns 130/143; the message of an error is
/// printed to stderr.
int run_cli(int argc, char** argv);

}  // namespace crucible
