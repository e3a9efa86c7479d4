// See include/crucible/common/denormals.h.

#include "crucible/common/denormals.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__SSE__)
#include <xmmintrin.h>
#define CRUCIBLE_HAVE_MXCSR 1
#else
#define CRUCIBLE_HAVE_MXCSR 0
#endif

namespace crucible {
namespace {

#if CRUCIBLE_HAVE_MXCSR
constexpr unsigned kFlushBits = 0x8000u | 0x0040u;  // FTZ (bit 15) | DAZ (bit 6)
void set_flush(bool on) {
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | kFlushBits) : (csr & ~kFlushBits));
}
#else
void set_flush(bool) {}
#endif

/// The calling thread and each intra-op thread. With LibTorch's OpenMP
/// backend a parallel_for over [0, threads) with grain 1 gives every thread
/// of the team exactly one index.
void set_flush_everywhere(bool on) {
  set_flush(on);
  const int64_t threads = at::get_num_threads();
  if (threads > 1 && !at::in_parallel_region()) {
    at::parallel_for(0, threads, 1, [on](int64_t, int64_t) { set_flush(on); });
  }
}

bool opted_out() {
  const char* v = std::getenv("CRUCIBLE_KEEP_DENORMALS");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

bool denormal_flush_supported() { return CRUCIBLE_HAVE_MXCSR != 0; }

bool denormals_flushed_on_this_thread() {
#if CRUCIBLE_HAVE_MXCSR
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
#else
  return false;
#endif
}

DenormalFlushGuard::DenormalFlushGuard(bool enabled) {
  if (!enabled || !denormal_flush_supported() || opted_out()) return;
  previously_flushed_ = denormals_flushed_on_this_thread();
  active_ = true;
  // Also when the caller flushes already: the intra-op threads may be new
  // since (at::set_num_threads).
  set_flush_everywhere(true);
}

DenormalFlushGuard::~DenormalFlushGuard() {
  if (active_ && !previously_flushed_) set_flush_everywhere(false);
}

}  // namespace crucible
