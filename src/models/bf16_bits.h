#pragma once
// bfloat16 <-> float by bit shifts, for the hand-written model loops
// (schnet/cfconv.cpp, schnet/shifted_softplus.cpp). Internal to src/models.
//
// bfloat16 is the upper half of a float32 (Kalamkar et al., "A Study of
// BFLOAT16 for Deep Learning Training", arXiv:1905.12322). c10::BFloat16's
// own conversions did not vectorise in these loops; these shifts and
// selects do, so the bf16 kernels run as wide as the float32 ones.

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace crucible::bf16_bits {

/// A value in its compute type: float for bfloat16 (exact), else itself.
inline float widen(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float widen(float v) { return v; }
inline double widen(double v) { return v; }

/// A compute-type value stored as T: for bfloat16, rounded to nearest,
/// ties to even (as c10::BFloat16 rounds); NaN stays a quiet NaN.
template <class T, class A>
inline T narrow(A v) {
  return static_cast<T>(v);
}
template <>
inline c10::BFloat16 narrow<c10::BFloat16, float>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>(v != v ? 0x7FC0u : rounded);
  return out;
}

}  // namespace crucible::bf16_bits
