#pragma once
// The names of floating dtypes as users write them (configs, model.json,
// the KIM settings, the Python module): float32, float64, bfloat16, float16.

#include <c10/core/ScalarType.h>

#include <initializer_list>
#include <optional>
#include <string>

namespace crucible {

/// "float32", "float64", "bfloat16" or "float16"; any other dtype by c10's
/// own name (e.g. "Long"). Never throws.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return c10::toString(t);
  }
}

/// The dtypes models run in (training.dtype, model.json, evaluate, the
/// calculator, the KIM model).
inline constexpr std::initializer_list<at::ScalarType> kModelDtypes = {at::kFloat, at::kDouble};

/// The dtype among `allowed` whose dtype_name is `name` (case-sensitive), or
/// nullopt: callers throw their own error (ConfigError, DataError, Python's
/// ValueError) naming the key or file. Never throws.
inline std::optional<at::ScalarType> dtype_from_name(const std::string& name,
                                                     std::initializer_list<at::ScalarType> allowed = kModelDtypes) {
  for (at::ScalarType t : allowed)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

/// The allowed names for an error message: "float32 or float64",
/// "float32, float64, bfloat16 or float16". Never throws.
inline std::string dtype_choices(std::initializer_list<at::ScalarType> allowed = kModelDtypes) {
  std::string out;
  size_t k = 0;
  for (at::ScalarType t : allowed) {
    if (k > 0) out += k + 1 == allowed.size() ? " or " : ", ";
    out += dtype_name(t);
    ++k;
  }
  return out;
}

}  // namespace crucible
