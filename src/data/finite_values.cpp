#include "crucible/data/finite_values.h"

#include "crucible/common/error.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace crucible {

void check_finite_values(const Structure& s) {
  auto check = [&](const char* name, const at::Tensor& t, int64_t columns) {
    if (!t.defined() || t.numel() == 0) return;
    const at::Tensor flat = t.detach().to(at::kCPU, at::kDouble).contiguous().view({-1});
    const at::Tensor bad = at::logical_not(at::isfinite(flat)).nonzero();
    if (bad.numel() == 0) return;
    const int64_t i = bad[0][0].item<int64_t>();
    const double v = flat[i].item<double>();
    const std::string where = columns > 0 ? fmt::format(" ({} {}, component {})", std::string(name) == "cell" ? "vector" : "atom",
                                                        i / columns, i % columns)
                                          : std::string();
    throw DataError(fmt::format("{}: {} must be finite numbers, got {}{}", s.source, name, v, where));
  };
  check("positions", s.positions, 3);
  check("cell", s.cell, 3);
  if (s.energy && !std::isfinite(*s.energy)) {
    throw DataError(fmt::format("{}: energy must be a finite number, got {}", s.source, *s.energy));
  }
  if (s.forces) check("forces", *s.forces, 3);
  if (s.stress) check("stress", *s.stress, 0);
}

}  // namespace crucible
