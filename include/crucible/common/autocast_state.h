#pragma once
// Autocast state of this thread, one spelling for LibTorch 1.13 and 2.x (the
// per-device API replaced the CPU/GPU pairs in 2.4). No tensors; none of
// these throws.

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace crucible {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(at::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
inline void set_autocast_enabled(at::DeviceType t, bool on) { at::autocast::set_autocast_enabled(t, on); }
inline at::ScalarType autocast_dtype(at::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
inline void set_autocast_dtype(at::DeviceType t, at::ScalarType d) { at::autocast::set_autocast_dtype(t, d); }
#else
/// Whether autocast is on for device type `t` (kCPU, or any GPU type) on this thread.
inline bool autocast_enabled(at::DeviceType t) {
  return t == at::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
/// Turns autocast on or off for `t` on this thread.
inline void set_autocast_enabled(at::DeviceType t, bool on) {
  if (t == at::kCPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
/// The dtype autocast casts to on `t` (bfloat16 / float16).
inline at::ScalarType autocast_dtype(at::DeviceType t) {
  return t == at::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
/// Sets the dtype autocast casts to on `t`.
inline void set_autocast_dtype(at::DeviceType t, at::ScalarType d) {
  if (t == at::kCPU) {
    at::autocast::set_autocast_cpu_dtype(d);
  } else {
    at::autocast::set_autocast_gpu_dtype(d);
  }
}
#endif

}  // namespace crucible
