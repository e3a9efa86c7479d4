#pragma once
// An exclusive lock on a run directory (issue 15): one writer at a time.

#include <filesystem>
#include <string>

namespace crucible {

/// Name of the lock file inside a run directory.
inline constexpr const char* kRunLockFile = ".lock";

/// Holds an exclusive flock(2) on RUN_DIR/.lock for its lifetime. Taken by
/// every command that writes a run directory (fresh, overwrite, resume; in a
/// data-parallel run by rank 0, the only writer) before anything in the
/// directory is checked or removed. The kernel drops a flock when its holder
/// dies, so a lock left by a killed process never blocks; the file itself
/// stays (it records the last holder: "pid <n> host <name> since <UTC time>"),
/// except that a lock whose directory still holds nothing but the lock file
/// at release removes the lock file it created, and the directory it created
/// (a refused start leaves no trace).
class RunDirLock {
 public:
  /// Creates `dir` (and parents) if missing, then takes the lock.
  /// @throws DataError "<dir> is in use by another crucible process (pid N
  ///   on host H, since T); wait for it to end or stop it first" when another
  ///   process holds it, and naming the directory and the system's reason
  ///   when the directory or lock file cannot be created or locked.
  explicit RunDirLock(const std::filesystem::path& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  int fd_ = -1;
  bool created_dir_ = false;   // the directory did not exist before
  bool created_file_ = false;  // nor did its lock file
};

/// True when `dir` holds nothing but its lock file (or nothing at all).
bool run_dir_is_empty(const std::filesystem::path& dir);

}  // namespace crucible
