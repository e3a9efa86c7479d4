// A CPU allocator that keeps freed large blocks for reuse. See
// include/crucible/training/allocator.h.

#include "crucible/training/allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <unistd.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <cstdint>
#include <optional>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace crucible {

namespace {

/// Physical memory in bytes; 0 where sysconf cannot tell.
size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

}  // namespace

namespace {

/// The first number in `path` ("max" and absent files: nullopt).
std::optional<int64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return static_cast<int64_t>(std::stoll(text));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// The value of `key` in a memory.stat file (0 when absent).
int64_t stat_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string k;
  int64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

}  // namespace

std::optional<int64_t> cgroup_available_bytes(const std::string& proc_self_cgroup, const std::string& root) {
  namespace fs = std::filesystem;
  std::ifstream in(proc_self_cgroup);
  std::optional<int64_t> best;
  std::error_code ec;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    bool v2 = false;
    fs::path base;
    if (controllers.empty()) {  // cgroup v2: the unified hierarchy
      v2 = true;
      base = fs::exists(fs::path(root) / "cgroup.controllers", ec) ? fs::path(root) : fs::path(root) / "unified";
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      base = fs::path(root) / "memory";
    } else {
      continue;
    }
    // From the process's cgroup up to the hierarchy's root (inside a
    // container the mount may start below the path /proc names).
    fs::path rel = fs::path(path).relative_path();
    while (true) {
      const fs::path dir = base / rel;
      if (fs::is_directory(dir, ec)) {
        const auto limit = read_number((dir / (v2 ? "memory.max" : "memory.limit_in_bytes")).string());
        const auto usage = read_number((dir / (v2 ? "memory.current" : "memory.usage_in_bytes")).string());
        // v1 reports "no limit" as a huge page-rounded number.
        if (limit && usage && *limit < (int64_t{1} << 60)) {
          const int64_t reclaimable =
              stat_value((dir / "memory.stat").string(), v2 ? "inactive_file" : "total_inactive_file");
          const int64_t left = std::max<int64_t>(0, *limit - std::max<int64_t>(0, *usage - reclaimable));
          best = best ? std::min(*best, left) : left;
        }
      }
      if (rel.empty() || rel == rel.parent_path()) break;
      rel = rel.parent_path();
    }
  }
  return best;
}

int64_t available_memory_bytes() {
  int64_t host = -1;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    int64_t kib = 0;
    while (in >> key >> kib >> unit) {
      if (key == "MemAvailable:") {
        host = kib * 1024;
        break;
      }
    }
  }
  if (host < 0) {
    const size_t physical = physical_memory_bytes();
    host = physical > 0 ? static_cast<int64_t>(physical) : INT64_MAX;
  }
  // Issue 47: a container's memory limit binds before the host's free memory.
  const auto cgroup = cgroup_available_bytes();
  return cgroup ? std::min(host, *cgroup) : host;
}

#if defined(__linux__)
namespace {

constexpr size_t kMinCached = size_t{16} << 20;  // below: glibc's heap reuses blocks (M_MMAP_THRESHOLD 32 MiB)
constexpr size_t kGranule = size_t{2} << 20;      // sizes and alignment: 2 MiB (<= 12.5% waste, huge pages)
// Medium blocks [16 KiB, 16 MiB): freed ones kept per 4 KiB size class, up
// to 64 MiB idle. The inference path's chunks allocate and free the same
// few sizes thousands of times a call; glibc's malloc (the host's in LAMMPS
// and Python) spent ~5% of a 16384-atom SchNet KIM step on them (perf,
// AMD EPYC VM with avx512_bf16).
constexpr size_t kMinPooled = size_t{16} << 10;
constexpr size_t kPage = size_t{4} << 10;
constexpr size_t kMediumIdleLimit = size_t{64} << 20;

/// A run of addresses that lies inside one mapping (VMA) of the kernel, so
/// that one mremap can move it (kernels before 6.17 refuse to move a range
/// that spans several mappings).
struct Piece {
  char* address;
  size_t bytes;
};

/// A block: pieces in address order, each starting where the previous one
/// ends; the block's address is the first piece's.
struct Block {
  std::vector<Piece> pieces;
  size_t bytes = 0;

  char* address() const { return pieces.front().address; }

  /// Cuts the first `bytes` (a multiple of 2 MiB, less than this block's
  /// size) off into the returned block; this one keeps the rest.
  Block take_front(size_t bytes_wanted) {
    Block front;
    while (front.bytes < bytes_wanted) {
      Piece& p = pieces.front();
      const size_t n = std::min(p.bytes, bytes_wanted - front.bytes);
      front.pieces.push_back({p.address, n});
      front.bytes += n;
      if (n == p.bytes) {
        pieces.erase(pieces.begin());
      } else {
        p.address += n;
        p.bytes -= n;
      }
    }
    bytes -= bytes_wanted;
    return front;
  }
};

/// Asks Linux to back [ptr, ptr + size) (2 MiB aligned, a multiple of 2 MiB)
/// with transparent huge pages where the kernel's THP mode is `madvise`
/// (Debian's default) or `always`; a no-op elsewhere or when the kernel
/// refuses. With 4 KiB pages, a 16384-atom training step streams each
/// [pairs, 64] tensor across ~10^4 pages (TLB misses, and the hardware
/// prefetchers stop at every page boundary): huge pages made a 6912-atom
/// SchNet training step 2-7% faster here (Zen 5 VM, 1 thread).
/// CRUCIBLE_HUGE_PAGES=0 in the environment leaves the kernel's default.
void advise_huge_pages(char* ptr, size_t size) {
#if defined(MADV_HUGEPAGE)
  static const bool wanted = [] {
    const char* v = std::getenv("CRUCIBLE_HUGE_PAGES");
    return v == nullptr || std::string(v) != "0";
  }();
  if (wanted) (void)madvise(ptr, size, MADV_HUGEPAGE);
#endif
}

/// A fresh 2 MiB-aligned anonymous mapping of `size` bytes (a multiple of
/// 2 MiB), or nullptr when the kernel refuses it.
char* map_aligned(size_t size) {
  void* raw = mmap(nullptr, size + kGranule, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* base = static_cast<char*>(raw);
  const uintptr_t misaligned = reinterpret_cast<uintptr_t>(base) % kGranule;
  const size_t head = misaligned == 0 ? 0 : kGranule - misaligned;
  if (head > 0) munmap(base, head);
  munmap(base + head + size, kGranule - head);
  advise_huge_pages(base + head, size);
  return base + head;
}

void unmap(const Block& block) {
  for (const Piece& p : block.pieces) munmap(p.address, p.bytes);
}

class LargeBlockCache final : public c10::Allocator {
 public:
  explicit LargeBlockCache(c10::Allocator* fallback)
      : fallback_(fallback), fallback_raw_deleter_(fallback->raw_deleter()) {
    const size_t physical = physical_memory_bytes();
    limit_ = (physical > 0 ? physical : size_t{1} << 34) / 2;
  }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return allocate_impl(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return allocate_impl(n); }
#endif
  // LibTorch's raw_allocate / raw_deallocate (used by oneDNN) need the
  // context to be the data pointer and one deleter that frees any block:
  // `release` tells cached blocks from the previous allocator's.
  c10::DeleterFnPtr raw_deleter() const override { return &LargeBlockCache::release; }

  size_t empty_idle() const {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t bytes = stats_.cached_bytes;
    empty();
    return bytes;
  }

  LargeBlockCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  static LargeBlockCache* instance;

 private:
  c10::DataPtr allocate_impl(size_t n) const {
    // Small blocks keep the previous allocator's DataPtr (context = data,
    // its raw deleter).
    if (n < kMinPooled) return fallback_->allocate(n);
    if (n < kMinCached) return allocate_medium(n);
    const size_t size = (n + kGranule - 1) / kGranule * kGranule;
    std::lock_guard<std::mutex> lock(mutex_);
    Block block = take(size);
    char* ptr = block.address();
    stats_.live_bytes += size;
    live_.emplace(ptr, std::move(block));
    return c10::DataPtr(ptr, ptr, &LargeBlockCache::release, c10::Device(c10::DeviceType::CPU));
  }

  /// A medium block: the last freed one of its 4 KiB size class, else the
  /// previous allocator's.
  c10::DataPtr allocate_medium(size_t n) const {
    const size_t size = (n + kPage - 1) / kPage * kPage;
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = idle_medium_.find(size);
      if (it != idle_medium_.end() && !it->second.empty()) {
        ptr = it->second.back();
        it->second.pop_back();
        idle_medium_bytes_ -= size;
      }
    }
    if (ptr == nullptr) ptr = fallback_->raw_allocate(size);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_medium_.emplace(ptr, size);
    }
    return c10::DataPtr(ptr, ptr, &LargeBlockCache::release, c10::Device(c10::DeviceType::CPU));
  }

  /// A block of `size` bytes. Called with the mutex held.
  Block take(size_t size) const {
    // The smallest idle block that holds the request, cut to its size; the
    // rest stays idle.
    auto it = free_.lower_bound(size);
    if (it != free_.end()) {
      Block block = std::move(it->second);
      free_.erase(it);
      stats_.cached_bytes -= block.bytes;
      if (block.bytes == size) return block;
      Block front = block.take_front(size);
      keep(std::move(block));
      return front;
    }
    // None does: a fresh mapping, into which the idle blocks, the largest
    // first, are moved (mremap moves their pages: no copy, no page fault)
    // until it is full, so that only the bytes that the idle blocks lack
    // are new. The cache thus never maps memory while it holds idle blocks,
    // and resident memory stays at the peak of what the tensors use.
    char* base = map_aligned(size);
    if (base == nullptr) {
      empty();
      base = map_aligned(size);
      if (base == nullptr) throw std::bad_alloc();
    }
    Block block;
    block.bytes = size;
    size_t filled = 0;   // bytes of [base, base + size) accounted for so far
    char* fresh = base;  // start of the run of fresh pages not yet recorded
    size_t moved_in = 0;
    while (filled < size && !free_.empty()) {
      auto largest = std::prev(free_.end());
      Block idle = std::move(largest->second);
      free_.erase(largest);
      stats_.cached_bytes -= idle.bytes;
      Block moving;
      if (idle.bytes <= size - filled) {
        moving = std::move(idle);
      } else {
        moving = idle.take_front(size - filled);
        keep(std::move(idle));
      }
      for (const Piece& p : moving.pieces) {
        char* to = base + filled;
        if (mremap(p.address, p.bytes, p.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to) == MAP_FAILED) {
          munmap(p.address, p.bytes);  // e.g. out of mappings: these bytes stay fresh
        } else {
          if (to > fresh) block.pieces.push_back({fresh, static_cast<size_t>(to - fresh)});
          block.pieces.push_back({to, p.bytes});
          fresh = to + p.bytes;
          moved_in += p.bytes;
          ++stats_.moved_pieces;
        }
        filled += p.bytes;
      }
    }
    stats_.fresh_bytes += size - moved_in;
    stats_.moved_bytes += moved_in;
    if (fresh < base + size) block.pieces.push_back({fresh, static_cast<size_t>(base + size - fresh)});
    return block;
  }

  /// Keeps an idle block, or unmaps it when the cache is full. Called with
  /// the mutex held.
  void keep(Block block) const {
    if (stats_.cached_bytes + block.bytes > limit_) {
      unmap(block);
      return;
    }
    stats_.cached_bytes += block.bytes;
    const size_t bytes = block.bytes;
    free_.emplace(bytes, std::move(block));
  }

  /// Unmaps every idle block and frees the idle medium ones. Called with
  /// the mutex held.
  void empty() const {
    for (const auto& entry : free_) unmap(entry.second);
    free_.clear();
    stats_.cached_bytes = 0;
    for (auto& entry : idle_medium_) {
      for (void* ptr : entry.second) fallback_raw_deleter_(ptr);
    }
    idle_medium_.clear();
    idle_medium_bytes_ = 0;
  }

  static void release(void* ptr) {
    LargeBlockCache* self = instance;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->live_.find(ptr);
      if (it != self->live_.end()) {
        Block block = std::move(it->second);
        self->live_.erase(it);
        self->stats_.live_bytes -= block.bytes;
        self->keep(std::move(block));
        return;
      }
      auto medium = self->live_medium_.find(ptr);
      if (medium != self->live_medium_.end()) {
        const size_t size = medium->second;
        self->live_medium_.erase(medium);
        if (self->idle_medium_bytes_ + size <= kMediumIdleLimit) {
          self->idle_medium_[size].push_back(ptr);
          self->idle_medium_bytes_ += size;
          return;
        }
      }
    }
    self->fallback_raw_deleter_(ptr);  // a block of the previous allocator
  }

  c10::Allocator* fallback_;
  c10::DeleterFnPtr fallback_raw_deleter_;
  size_t limit_;
  mutable std::mutex mutex_;
  mutable std::multimap<size_t, Block> free_;
  mutable std::unordered_map<void*, Block> live_;
  mutable std::unordered_map<size_t, std::vector<void*>> idle_medium_;  // by size class
  mutable std::unordered_map<void*, size_t> live_medium_;
  mutable size_t idle_medium_bytes_ = 0;
  mutable LargeBlockCacheStats stats_;
};

LargeBlockCache* LargeBlockCache::instance = nullptr;

}  // namespace
#endif  // __linux__

void install_large_block_cache() {
#if defined(__linux__)
  static std::once_flag once;
  std::call_once(once, [] {
    const char* keep = std::getenv("CRUCIBLE_DEFAULT_MALLOC");
    if (keep && std::string(keep) == "1") return;
    c10::Allocator* previous = c10::GetCPUAllocator();
    // The previous allocator must free its blocks through one raw deleter
    // (LibTorch's default does); otherwise keep it.
    if (!previous || !previous->raw_deleter()) return;
    auto* cache = new LargeBlockCache(previous);  // lives as long as the process
    LargeBlockCache::instance = cache;
    c10::SetCPUAllocator(cache, /*priority=*/1);
  });
#endif
}

bool large_block_cache_stats(LargeBlockCacheStats* out) {
#if defined(__linux__)
  if (LargeBlockCache::instance == nullptr) return false;
  *out = LargeBlockCache::instance->stats();
  return true;
#else
  (void)out;
  return false;
#endif
}

size_t empty_large_block_cache() {
#if defined(__linux__)
  if (LargeBlockCache::instance != nullptr) return LargeBlockCache::instance->empty_idle();
#endif
  return 0;
}

}  // namespace crucible
