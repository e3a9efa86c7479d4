#include "posix_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <streambuf>
#include <system_error>
#include <vector>

#include "crucible/checkpoint/sha256.h"
#include "crucible/common/error.h"

namespace crucible::checkpoint::detail {

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

void Fd::close_or_throw(const std::string& what) {
  const int f = release();
  if (f >= 0 && ::close(f) != 0 && errno != EINTR) throw_errno("close", what);
}

void throw_errno(const std::string& what, const fs::path& path) {
  const int e = errno;
  throw std::system_error(e, std::generic_category(), what + ": " + path.string());
}

void fsync_dir(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_errno("open directory for fsync", dir);
  if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != ENOTSUP) throw_errno("fsync directory", dir);
}

std::string unique_suffix() {
  static std::random_device rd;
  static std::mt19937_64 gen(rd() ^ (static_cast<std::uint64_t>(::getpid()) << 32));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%ld-%08llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(gen() & 0xffffffffULL));
  return buf;
}

namespace {

/// Write-only streambuf onto a file descriptor that hashes and counts.
class HashingFdBuf : public std::streambuf {
 public:
  explicit HashingFdBuf(int fd) : fd_(fd), buf_(1 << 16) { reset(); }

  bool finish() { return flush_buffer(); }
  std::uint64_t size() const { return size_; }
  std::string digest() { return hash_.hex_digest(); }
  int error() const { return errno_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!flush_buffer()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return flush_buffer() ? 0 : -1; }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n < static_cast<std::streamsize>(buf_.size())) return std::streambuf::xsputn(s, n);
    if (!flush_buffer() || !write_raw(s, static_cast<std::size_t>(n))) return 0;
    return n;
  }
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode which) override {
    // tellp() only: the position is the number of bytes written so far.
    if (off == 0 && dir == std::ios_base::cur && (which & std::ios_base::out))
      return pos_type(static_cast<off_type>(size_ + static_cast<std::uint64_t>(pptr() - pbase())));
    return pos_type(off_type(-1));
  }

 private:
  void reset() { setp(buf_.data(), buf_.data() + buf_.size()); }
  bool flush_buffer() {
    const auto n = static_cast<std::size_t>(pptr() - pbase());
    if (n > 0 && !write_raw(pbase(), n)) return false;
    reset();
    return true;
  }
  bool write_raw(const char* p, std::size_t n) {
    if (errno_ != 0) return false;
    hash_.update(p, n);
    size_ += n;
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        errno_ = errno;
        return false;
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  int fd_;
  std::vector<char> buf_;
  Sha256 hash_;
  std::uint64_t size_ = 0;
  int errno_ = 0;
};

}  // namespace

WrittenFile write_file_durably(const fs::path& final_path,
                               const std::function<void(std::ostream&)>& writer,
                               const std::function<void()>& before_rename, bool* keep_temp_on_error) {
  const fs::path tmp =
      final_path.parent_path() / ("." + final_path.filename().string() + ".tmp-" + unique_suffix());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (fd.get() < 0) throw_errno("create temporary file", tmp);
  try {
    HashingFdBuf buf(fd.get());
    {
      std::ostream os(&buf);
      writer(os);
      os.flush();
      if (!os || !buf.finish()) {
        if (buf.error() != 0) {
          errno = buf.error();
          throw_errno("write", tmp);
        }
        throw std::system_error(std::make_error_code(std::errc::io_error),
                                "write: the writer left the stream failed: " + tmp.string());
      }
    }
    WrittenFile out{buf.size(), buf.digest()};
    if (::fsync(fd.get()) != 0) throw_errno("fsync", tmp);
    fd.close_or_throw(tmp.string());
    if (before_rename) before_rename();
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) throw_errno("rename to " + final_path.string(), tmp);
    fsync_dir(final_path.parent_path());
    return out;
  } catch (...) {
    if (!(keep_temp_on_error && *keep_temp_on_error)) ::unlink(tmp.c_str());
    throw;
  }
}

bool is_inside(const fs::path& p, const fs::path& root) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (ri->empty()) continue;  // trailing separator of root
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

Fd open_confined(const fs::path& root, const fs::path& path, std::uint64_t* size) {
  std::error_code ec;
  const fs::path canon = fs::canonical(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory)
      throw DataError(path.string() + ": the file must exist, got missing");
    throw DataError(path.string() + ": the file must be resolvable, got " + ec.message());
  }
  if (!is_inside(canon, root))
    throw DataError(path.string() + ": the file must lie inside the checkpoint directory " +
                    root.string() + ", got a path resolving outside it to " + canon.string() +
                    " (not opened)");
  // No symbolic link below the store root is followed (issue 15): not the
  // file, not a checkpoint folder, even if it points inside the store.
  {
    fs::path at = root;
    const fs::path rel = path.lexically_relative(root);
    if (!rel.empty() && *rel.begin() != "..") {
      for (const auto& part : rel) {
        at /= part;
        std::error_code lec;
        if (fs::is_symlink(fs::symlink_status(at, lec))) {
          throw DataError(path.string() + ": must not be reached through a symbolic link inside "
                          "the checkpoint directory, got " + at.string() + " (not followed)");
        }
      }
    }
  }
  Fd fd(::open(canon.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0)
    throw DataError(path.string() + ": the file must be readable, got " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw DataError(path.string() + ": the file must be stat-able, got " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw DataError(path.string() + ": the file must be a regular file, got another kind of file");
  *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

std::string read_and_hash(int fd, std::uint64_t size, const fs::path& path, std::string* out) {
  Sha256 hash;
  std::vector<char> chunk;
  char* dst = nullptr;
  if (out) {
    out->assign(static_cast<std::size_t>(size), '\0');
    dst = out->data();
  } else {
    chunk.resize(1 << 16);
  }
  std::uint64_t done = 0;
  while (done < size) {
    const std::size_t want =
        out ? static_cast<std::size_t>(size - done)
            : static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), size - done));
    char* p = out ? dst + done : chunk.data();
    const ssize_t got = ::read(fd, p, want);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw_errno("read", path);
    }
    if (got == 0)
      throw DataError(path.string() + ": size must be " + std::to_string(size) +
                      " bytes, got " + std::to_string(done) + " bytes (the file shrank while read)");
    hash.update(p, static_cast<std::size_t>(got));
    done += static_cast<std::uint64_t>(got);
  }
  char extra;
  ssize_t more;
  while ((more = ::read(fd, &extra, 1)) < 0 && errno == EINTR) {
  }
  if (more > 0)
    throw DataError(path.string() + ": size must be " + std::to_string(size) +
                    " bytes, got more (the file grew while read)");
  return hash.hex_digest();
}

}  // namespace crucible::checkpoint::detail

