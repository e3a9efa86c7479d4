// A run directory's life (crucible/run/run_dir.h).

#include "crucible/run/run_dir.h"

#include "crucible/common/error.h"
#include "crucible/run/run_lock.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <system_error>
#include <vector>

namespace crucible {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace

fs::path choose_run_dir(const OutputConfig& o) {
  if (!o.run_dir) {
    const fs::path base = fs::path("runs") / timestamp();
    fs::path p = base;
    for (int i = 2; fs::exists(p); ++i) p = base.string() + "-" + std::to_string(i);
    return p;
  }
  const fs::path p(*o.run_dir);
  if (fs::exists(p) && !fs::is_directory(p)) {
    throw ConfigError("output.run_dir must be a directory, got '" + p.string() +
                      "', which is an existing file");
  }
  return p;
}

bool finished_run(const fs::path& dir) {
  std::ifstream in(dir / "summary.json");
  if (!in) return false;
  try {
    const json j = json::parse(in);
    return j.is_object() && j.contains("steps");
  } catch (const json::exception&) {
    return false;
  }
}

void check_run_dir(const fs::path& p, const OutputConfig& o) {
  if (o.overwrite) return;
  if (finished_run(p)) {
    throw ConfigError("output.run_dir '" + p.string() +
                      "' holds a finished run (summary.json exists); choose another "
                      "output.run_dir or set output.overwrite=true to replace it");
  }
  if (!run_dir_is_empty(p)) {
    throw ConfigError("output.run_dir '" + p.string() +
                      "' exists and is not empty (an unfinished run?); choose another "
                      "output.run_dir or set output.overwrite=true");
  }
}

void probe_writable(const fs::path& dir) {
  const fs::path probe = dir / (".crucible-write-probe-" + std::to_string(::getpid()));
  auto fail = [&](const std::string& why) {
    ::unlink(probe.c_str());
    throw DataError(dir.string() + ": run directory must be writable with free space, got " + why +
                    " (a 1 MiB probe write failed before training; nothing of the run was changed)");
  };
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail(std::strerror(errno));
  std::vector<char> zeros(1 << 16, 0);
  for (int i = 0; i < 16; ++i) {
    size_t done = 0;
    while (done < zeros.size()) {
      const ssize_t n = ::write(fd, zeros.data() + done, zeros.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int e = n < 0 ? errno : ENOSPC;
        ::close(fd);
        fail(std::strerror(e));
      }
      done += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail(std::strerror(e));
  }
  if (::close(fd) != 0) fail(std::strerror(errno));
  ::unlink(probe.c_str());
}

void prepare_run_dir(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) throw DataError(p.string() + ": run directory cannot be created (" + ec.message() + ")");
  probe_writable(p);
  // summary.json first: from now on the directory must not look finished.
  for (const char* f : {"summary.json", "model.pt", "model_last.pt", "model.json", "metrics.csv", "metrics.jsonl",
                        "learning_curve.svg", "config.yaml"}) {
    fs::remove(p / f, ec);
    if (ec) throw DataError((p / f).string() + ": cannot remove old file (" + ec.message() + ")");
  }
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw DataError(tmp.string() + ": cannot be created");
    out << text;
    out.flush();
    if (!out) throw DataError(tmp.string() + ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw DataError(path.string() + ": cannot be written (" + ec.message() + ")");
}

}  // namespace crucible
