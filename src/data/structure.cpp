#include "crucible/data/structure.h"

#include <cmath>

namespace crucible {

double Structure::volume() const {
  if (!cell.defined()) return 0.0;
  return std::abs(at::linalg_det(cell.to(at::kDouble)).item<double>());
}

}  // namespace crucible
