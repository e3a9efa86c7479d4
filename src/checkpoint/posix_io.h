#pragma once
// Internal: durable writes (temp + fsync + rename) and confined reads.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string>

namespace crucible::checkpoint::detail {

namespace fs = std::filesystem;

/// Closes a file descriptor on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }
  /// close(2), throwing std::system_error naming `what` on failure.
  void close_or_throw(const std::string& what);

 private:
  int fd_ = -1;
};

/// Throws std::system_error(errno) with "<what>: <path>".
[[noreturn]] void throw_errno(const std::string& what, const fs::path& path);

/// fsync(2) of a directory (so renames and creations in it are durable).
/// EINVAL/ENOTSUP (file systems that cannot sync directories) are ignored.
void fsync_dir(const fs::path& dir);

/// A few random hex characters for temporary names ("<pid>-<8 hex>").
std::string unique_suffix();

/// Size and SHA-256 of what write_file_durably wrote.
struct WrittenFile {
  std::uint64_t size = 0;
  std::string sha256;
};

/// Writes `final_path` durably: `writer` streams into a new temporary
/// ".<name>.tmp-<suffix>" next to it (O_EXCL), which is fsync'd, closed,
/// passed to `before_rename` (may be empty), renamed over `final_path`, and
/// the parent folder fsync'd. On an exception the temporary is removed unless
/// `*keep_temp_on_error` is set by then. Throws std::system_error on I/O
/// errors (a writer leaving the stream failed included).
WrittenFile write_file_durably(const fs::path& final_path,
                               const std::function<void(std::ostream&)>& writer,
                               const std::function<void()>& before_rename = {},
                               bool* keep_temp_on_error = nullptr);

/// True when `p` equals `root` or lies below it (both canonical).
bool is_inside(const fs::path& p, const fs::path& root);

/// Opens `path` for reading only if it resolves (std::filesystem::canonical,
/// symlinks followed) to a regular file inside `root` (canonical). The open
/// uses O_NOFOLLOW|O_NONBLOCK. Throws DataError naming `path`: missing,
/// outside the directory, not a regular file, unreadable. `*size` gets the
/// file's size (fstat).
Fd open_confined(const fs::path& root, const fs::path& path, std::uint64_t* size);

/// Reads exactly `size` bytes from `fd` into `out` (if non-null) while
/// hashing them; returns the SHA-256 hex. DataError naming `path` when the
/// file ends early or grows, std::system_error on read errors.
std::string read_and_hash(int fd, std::uint64_t size, const fs::path& path, std::string* out);

}  // namespace crucible::checkpoint::detail
