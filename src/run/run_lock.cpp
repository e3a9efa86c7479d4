// RunDirLock. See include/crucible/run/run_lock.h.

#include "crucible/run/run_lock.h"

#include "crucible/common/error.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

namespace crucible {

namespace fs = std::filesystem;

RunDirLock::RunDirLock(const fs::path& dir) : dir_(dir) {
  std::error_code ec;
  created_dir_ = !fs::exists(dir, ec);
  created_file_ = !fs::exists(dir / kRunLockFile, ec);
  fs::create_directories(dir, ec);
  if (ec) throw DataError(dir.string() + ": run directory cannot be created (" + ec.message() + ")");
  const fs::path file = dir / kRunLockFile;
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) {
    throw DataError(file.string() + ": the run directory's lock file cannot be opened (" +
                    std::strerror(errno) + ")");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    std::string holder;
    char buf[256];
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    if (n > 0) holder.assign(buf, static_cast<size_t>(n));
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK) {
      throw DataError(dir.string() + " is in use by another crucible process (" +
                      (holder.empty() ? std::string("holder unknown") : holder) +
                      "); wait for it to end or stop it first, or choose another output.run_dir");
    }
    throw DataError(file.string() + ": cannot be locked (" + std::strerror(e) + ")");
  }
  // Record the holder for the message a second writer gets.
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string text = "pid " + std::to_string(::getpid()) + " on host " + host + ", since " +
                           when + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    (void)!::pwrite(fd_, text.data(), text.size(), 0);
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  // Issue 47: a start refused before anything was written leaves nothing:
  // the lock file and the directory go again if this lock made them.
  if (created_file_ && run_dir_is_empty(dir_)) {
    ::unlink((dir_ / kRunLockFile).c_str());
    if (created_dir_) ::rmdir(dir_.c_str());
  }
  ::close(fd_);  // releases the flock
}

bool run_dir_is_empty(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != kRunLockFile) return false;
  }
  return true;
}

}  // namespace crucible
