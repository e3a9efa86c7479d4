#pragma once
// `crucible train --nproc N`: N local workers under torchrun-style
// variables (issue 6), watched until they all end.

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

namespace crucible {

/// Environment variable naming the pipe a launched worker writes one byte
/// to once it joined the process group (signal_launcher_ready).
inline constexpr const char* kLauncherReadyFdEnv = "CRUCIBLE_LAUNCHER_READY_FD";

/// Tells the launcher (if this process was started by launch_local_workers)
/// that this worker joined the process group. Never throws; a no-op otherwise.
void signal_launcher_ready();

/// Options of launch_local_workers.
struct LaunchOptions {
  int nproc = 2;  ///< workers, >= 1.
  /// After a worker fails, the others get this long (their collective
  /// timeout plus a margin) to exit on their own before they are killed.
  std::chrono::milliseconds grace{130000};
};

/// A free TCP port on 127.0.0.1 (bound and released; another process may
/// take it first, as with torchrun's own choice). @throws std::system_error.
int free_local_port();

/// Runs `executable args...` nproc times with RANK, LOCAL_RANK = 0..nproc-1,
/// WORLD_SIZE = nproc, MASTER_ADDR = 127.0.0.1 and a free MASTER_PORT;
/// SIGINT / SIGTERM received meanwhile are forwarded to every worker. When
/// a worker exits non-zero or by a signal, says which rank and how on
/// `err`, waits up to `grace` for the others, then kills those left.
/// Returns 0 if every worker exited 0, else the first failure's exit code
/// (128 + signal for a killed worker); workers that stopped after a SIGINT /
/// SIGTERM (exit 130 / 143, checkpoint written) are no failure and their
/// code is passed on. A worker that fails before every worker called
/// signal_launcher_ready() (start-up: nothing to save yet) makes the
/// launcher kill the others at once, so the failure is reported within
/// moments instead of after their timeouts. Every worker gets PR_SET_PDEATHSIG = SIGKILL (and
/// checks its parent before exec), so a launcher killed with SIGKILL takes
/// its workers with it.
/// @throws std::system_error if a worker cannot be started.
int launch_local_workers(const std::string& executable, const std::vector<std::string>& args,
                         const LaunchOptions& options, std::ostream& err);

}  // namespace crucible
