#include "crucible/checkpoint/checkpoint_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <memory>
#include <ostream>
#include <set>
#include <stdexcept>
#include <system_error>

#include "crucible/common/error.h"
#include "manifest.h"
#include "posix_io.h"

namespace crucible::checkpoint {

using detail::Fd;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kMaxManifestBytes = 64ull << 20;
const char* const kManifest = "manifest.json";
const char* const kLock = ".lock";
const char* const kTmpPrefix = ".tmp-";
const char* const kManifestTmpPrefix = ".manifest.json.tmp-";

bool valid_component(const std::string& c) {
  if (c.empty() || c.size() > 255 || c[0] == '.') return false;
  for (char ch : c) {
    const bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                    ch == '.' || ch == '_' || ch == '+' || ch == '=' || ch == '@' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

std::string utc_now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm u{};
  gmtime_r(&t, &u);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &u);
  return buf;
}

/// Exclusive flock(2) on DIR/.lock for the lifetime of the object.
class WriterLock {
 public:
  explicit WriterLock(const fs::path& root) {
    const fs::path p = root / kLock;
    fd_ = Fd(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (fd_.get() < 0) detail::throw_errno("open lock file", p);
    while (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno == EWOULDBLOCK)
        throw std::runtime_error("checkpoint directory " + root.string() +
                                 " is being written by another CheckpointStore (" + p.string() +
                                 " is locked)");
      detail::throw_errno("flock", p);
    }
  }

 private:
  Fd fd_;
};

std::vector<CheckpointEntry> read_manifest(const fs::path& root) {
  const fs::path p = root / kManifest;
  std::error_code ec;
  const auto st = fs::symlink_status(p, ec);
  if (ec || !fs::exists(st)) return {};
  std::uint64_t size = 0;
  Fd fd = detail::open_confined(root, p, &size);
  if (size > kMaxManifestBytes)
    throw DataError(p.string() + ": size must be at most " + std::to_string(kMaxManifestBytes) +
                    " bytes, got " + std::to_string(size));
  std::string text;
  detail::read_and_hash(fd.get(), size, p, &text);
  return detail::parse_manifest(text, p.string());
}

/// Canonical store root, or nullopt when the directory does not exist.
std::optional<fs::path> existing_root(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return std::nullopt;
  return fs::canonical(dir);
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

/// Removes temporaries and ckpt-* folders that `entries` do not name.
void collect(const fs::path& root, const std::vector<CheckpointEntry>& entries) {
  std::set<std::string> keep;
  for (const auto& e : entries) keep.insert(e.dir);
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool tmp = name.rfind(kTmpPrefix, 0) == 0 || name.rfind(kManifestTmpPrefix, 0) == 0;
    const bool orphan = detail::parse_dir_name(name).has_value() && !keep.count(name);
    if (tmp || orphan) doomed.push_back(it->path());
  }
  for (const auto& p : doomed) remove_quietly(p);  // remove_all never follows symlinks
}

/// Indices that the policy removes from `entries`; `keep_index` always stays.
std::set<std::int64_t> retired_by(const std::vector<CheckpointEntry>& entries, const RetentionPolicy& policy,
                                  std::optional<std::int64_t> keep_index) {
  std::set<std::int64_t> removed;
  if (policy.keep_last == 0) return removed;
  std::vector<std::int64_t> by_index;
  for (const auto& e : entries) by_index.push_back(e.index);
  std::sort(by_index.rbegin(), by_index.rend());
  std::set<std::int64_t> kept;
  for (std::size_t i = 0; i < by_index.size() && i < policy.keep_last; ++i) kept.insert(by_index[i]);
  if (!policy.keep_best_by.empty() && policy.keep_best > 0) {
    std::vector<const CheckpointEntry*> ranked;
    for (const auto& e : entries)
      if (e.metric && e.metric->name == policy.keep_best_by && !std::isnan(e.metric->value))
        ranked.push_back(&e);
    const bool min = policy.mode == RetentionPolicy::Mode::min;
    std::sort(ranked.begin(), ranked.end(), [min](const CheckpointEntry* a, const CheckpointEntry* b) {
      const double va = a->metric->value, vb = b->metric->value;
      if (va != vb) return min ? va < vb : va > vb;
      return a->index > b->index;
    });
    for (std::size_t i = 0; i < ranked.size() && i < policy.keep_best; ++i) kept.insert(ranked[i]->index);
  }
  if (keep_index) kept.insert(*keep_index);
  for (const auto& e : entries)
    if (!kept.count(e.index)) removed.insert(e.index);
  return removed;
}

void write_manifest(const fs::path& root, const std::vector<CheckpointEntry>& entries,
                    const std::function<void()>& before_rename = {}, bool* keep_temp = nullptr) {
  const std::string text = detail::dump_manifest(entries);
  // The temporary is "<root>/.manifest.json.tmp-<suffix>" so collect() finds it.
  const fs::path final_path = root / kManifest;
  detail::write_file_durably(
      final_path, [&](std::ostream& os) { os.write(text.data(), static_cast<std::streamsize>(text.size())); },
      before_rename, keep_temp);
}

const CheckpointEntry& find_entry(const std::vector<CheckpointEntry>& entries, std::int64_t index,
                                  const fs::path& manifest) {
  for (const auto& e : entries)
    if (e.index == index) return e;
  std::string have;
  for (const auto& e : entries) have += (have.empty() ? "" : ", ") + std::to_string(e.index);
  throw DataError(manifest.string() + ": checkpoint " + std::to_string(index) +
                  " must be listed, got " + (have.empty() ? "no checkpoints" : "indices " + have));
}

/// Verifies (and with `out`, loads) the files of `e`; DataError on the first bad one.
void verify_entry(const fs::path& root, const CheckpointEntry& e, CheckpointFiles* out,
                  const std::string* only = nullptr) {
  for (const auto& f : e.files) {
    if (only && f.name != *only) continue;
    const fs::path p = root / e.dir / fs::path(f.name);
    std::uint64_t real = 0;
    Fd fd = detail::open_confined(root, p, &real);
    if (real != f.size)  // checked before any allocation
      throw DataError(p.string() + ": size must be " + std::to_string(f.size) +
                      " bytes (manifest.json), got " + std::to_string(real) + " bytes");
    std::string bytes;
    const std::string sha = detail::read_and_hash(fd.get(), f.size, p, out ? &bytes : nullptr);
    if (sha != f.sha256)
      throw DataError(p.string() + ": sha256 must be " + f.sha256 + " (manifest.json), got " + sha +
                      " (corrupted)");
    if (out) (*out)[f.name] = std::move(bytes);
  }
}

}  // namespace

bool is_valid_file_name(const std::string& name) {
  const auto slash = name.find('/');
  if (slash == std::string::npos) return valid_component(name);
  return valid_component(name.substr(0, slash)) && valid_component(name.substr(slash + 1));
}

CheckpointFile CheckpointFile::from_bytes(std::string name, std::string data) {
  auto shared = std::make_shared<const std::string>(std::move(data));
  return CheckpointFile{std::move(name), [shared](std::ostream& os) {
                          os.write(shared->data(), static_cast<std::streamsize>(shared->size()));
                        }};
}

CheckpointStore::CheckpointStore(fs::path dir, RetentionPolicy retention)
    : dir_(std::move(dir)), retention_(std::move(retention)) {}

CheckpointEntry CheckpointStore::save(std::int64_t index, const CheckpointCounters& counters,
                                      const std::vector<CheckpointFile>& files,
                                      std::optional<CheckpointMetric> metric,
                                      const SaveFaultHook& fault_hook) {
  if (index < -1)
    throw std::invalid_argument("CheckpointStore::save: index must be -1 (append) or >= 0, got " +
                                std::to_string(index));
  std::set<std::string> names, folders;
  for (const auto& f : files) {
    if (!is_valid_file_name(f.name))
      throw std::invalid_argument("CheckpointStore::save: file name must be a plain relative name "
                                  "(one optional subfolder, [A-Za-z0-9._+=@-], no leading '.'), got \"" +
                                  f.name + "\"");
    if (!names.insert(f.name).second)
      throw std::invalid_argument("CheckpointStore::save: file name \"" + f.name + "\" given twice");
    if (!f.write)
      throw std::invalid_argument("CheckpointStore::save: file \"" + f.name + "\" has no writer");
    const auto slash = f.name.find('/');
    if (slash != std::string::npos) folders.insert(f.name.substr(0, slash));
  }
  for (const auto& d : folders)
    if (names.count(d))
      throw std::invalid_argument("CheckpointStore::save: \"" + d + "\" is both a file and a folder");
  if (metric && metric->name.empty())
    throw std::invalid_argument("CheckpointStore::save: metric name must be non-empty");
  for (const auto& [k, v] : counters.extra)
    if (k.empty()) throw std::invalid_argument("CheckpointStore::save: counter names must be non-empty");

  if (fs::create_directories(dir_)) {
    std::error_code ec;  // best effort: make the new directory's own entry durable
    const fs::path parent = fs::absolute(dir_, ec).parent_path();
    if (!ec) try { detail::fsync_dir(parent); } catch (const std::exception&) {}
  }
  const fs::path root = fs::canonical(dir_);
  WriterLock lock(root);
  const std::vector<CheckpointEntry> old = read_manifest(root);  // DataError: never overwritten
  collect(root, old);

  CheckpointEntry entry;
  entry.index = index;
  if (index < 0) entry.index = old.empty() ? 0 : old.back().index + 1;
  std::int64_t revision = 0;
  for (const auto& e : old)
    if (e.index == entry.index) revision = detail::parse_dir_name(e.dir)->second + 1;
  for (;; ++revision) {  // a leftover collect() could not remove keeps its name
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(root / detail::checkpoint_dir_name(entry.index, revision), ec)))
      break;
  }
  entry.dir = detail::checkpoint_dir_name(entry.index, revision);
  entry.counters = counters;
  entry.time = utc_now_iso8601();
  entry.metric = std::move(metric);

  const fs::path tmp = root / (kTmpPrefix + entry.dir + "-" + detail::unique_suffix());
  const fs::path final_dir = root / entry.dir;
  bool crashed = false;  // the fault hook threw: leave everything as a crash would
  bool folder_renamed = false, manifest_renamed = false;
  auto hook = [&](const std::string& phase) {
    if (!fault_hook) return;
    try {
      fault_hook(phase);
    } catch (...) {
      crashed = true;
      throw;
    }
  };

  std::vector<CheckpointEntry> next;
  try {
    if (!fs::create_directory(tmp)) throw std::runtime_error("temporary folder exists: " + tmp.string());
    std::set<std::string> made;
    for (const auto& f : files) {
      const auto slash = f.name.find('/');
      if (slash != std::string::npos && made.insert(f.name.substr(0, slash)).second) {
        fs::create_directory(tmp / f.name.substr(0, slash));
        detail::fsync_dir(tmp);
      }
      const detail::WrittenFile w = detail::write_file_durably(tmp / fs::path(f.name), f.write);
      entry.files.push_back({f.name, w.size, w.sha256});
      hook("file_written:" + f.name);
    }
    detail::fsync_dir(tmp);
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) detail::throw_errno("rename to " + final_dir.string(), tmp);
    folder_renamed = true;
    detail::fsync_dir(root);
    hook("folder_renamed");

    for (const auto& e : old)
      if (e.index != entry.index) next.push_back(e);
    next.push_back(entry);
    const auto removed = retired_by(next, retention_, entry.index);
    next.erase(std::remove_if(next.begin(), next.end(),
                              [&](const CheckpointEntry& e) { return removed.count(e.index) > 0; }),
               next.end());
    write_manifest(root, next, [&] { hook("manifest_written"); }, &crashed);
    manifest_renamed = true;
    hook("manifest_renamed");
  } catch (...) {
    if (!crashed) {
      remove_quietly(tmp);
      if (folder_renamed && !manifest_renamed) remove_quietly(final_dir);
    }
    throw;
  }
  collect(root, next);
  return entry;
}

std::vector<std::int64_t> CheckpointStore::prune() {
  const auto root = existing_root(dir_);
  if (!root) return {};
  WriterLock lock(*root);
  std::vector<CheckpointEntry> entries = read_manifest(*root);
  const auto removed = retired_by(entries, retention_, std::nullopt);
  if (!removed.empty()) {
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const CheckpointEntry& e) { return removed.count(e.index) > 0; }),
                  entries.end());
    write_manifest(*root, entries);
  }
  collect(*root, entries);
  return {removed.begin(), removed.end()};
}

void CheckpointStore::collect_garbage() {
  const auto root = existing_root(dir_);
  if (!root) return;
  WriterLock lock(*root);
  collect(*root, read_manifest(*root));
}

std::vector<CheckpointEntry> CheckpointStore::list() const {
  const auto root = existing_root(dir_);
  if (!root) return {};
  return read_manifest(*root);
}

std::optional<CheckpointEntry> CheckpointStore::find(std::int64_t index) const {
  for (auto& e : list())
    if (e.index == index) return e;
  return std::nullopt;
}

CheckpointFiles CheckpointStore::load(std::int64_t index) const {
  const auto root = existing_root(dir_);
  const auto entries = root ? read_manifest(*root) : std::vector<CheckpointEntry>{};
  const CheckpointEntry e = find_entry(entries, index, manifest_path());
  CheckpointFiles out;
  verify_entry(*root, e, &out);
  return out;
}

std::string CheckpointStore::load_file(std::int64_t index, const std::string& name) const {
  const auto root = existing_root(dir_);
  const auto entries = root ? read_manifest(*root) : std::vector<CheckpointEntry>{};
  const CheckpointEntry e = find_entry(entries, index, manifest_path());
  const bool listed = std::any_of(e.files.begin(), e.files.end(),
                                  [&](const CheckpointFileInfo& f) { return f.name == name; });
  if (!listed)
    throw DataError(manifest_path().string() + ": checkpoint " + std::to_string(index) +
                    " must list a file \"" + name + "\", got no such file");
  CheckpointFiles out;
  verify_entry(*root, e, &out, &name);
  return std::move(out.at(name));
}

void CheckpointStore::verify(std::int64_t index) const {
  const auto root = existing_root(dir_);
  const auto entries = root ? read_manifest(*root) : std::vector<CheckpointEntry>{};
  verify_entry(*root, find_entry(entries, index, manifest_path()), nullptr);
}

IntactCheckpoint CheckpointStore::newest_intact() const {
  IntactCheckpoint out;
  const auto root = existing_root(dir_);
  if (!root) return out;
  const auto entries = read_manifest(*root);
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    try {
      verify_entry(*root, *it, nullptr);
      out.entry = *it;
      return out;
    } catch (const DataError& e) {
      out.failed.push_back({it->index, e.what()});
    }
  }
  return out;
}

}  // namespace crucible::checkpoint
