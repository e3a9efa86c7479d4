// Resource limits checked before allocation. See
// include/crucible/run/resource_limits.h.

#include "crucible/run/resource_limits.h"
#include "crucible/models/registry.h"

#include "crucible/common/error.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

namespace crucible {

namespace {

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace

void check_thread_count(int64_t num_threads) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (num_threads > 4 * cores) {
    throw ConfigError(fmt::format("training.num_threads must be <= {} (4 × the {} cores of this "
                                  "machine), got {}",
                                  4 * cores, cores, num_threads));
  }
}

double model_parameter_estimate(const ModelConfig& m) {
  ModelBuildContext ctx;
  ctx.type = m.type;
  ctx.params = &m.params;
  ctx.cutoff = m.cutoff;
  try {
    return model_factory(m.type).parameter_estimate(ctx);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("model.") + m.type + ": " + e.what());
  }
}

void check_model_size(const ModelConfig& m, int64_t available_bytes) {
  const double params = model_parameter_estimate(m);
  const double bytes = 16.0 * params;
  if (bytes > static_cast<double>(available_bytes)) {
    std::string keys;
    for (const auto& k : model_factory(m.type).keys) keys += (keys.empty() ? "" : ", ") + ("model." + m.type + "." + k.name);
    throw ConfigError(fmt::format(
        "the model.{} keys ({}) give about {:.2g} parameters, whose training state (weights, "
        "gradients, optimizer moments: {:.2g} bytes) exceeds the {} of memory available; choose "
        "smaller values (typical: 32-256 channels, 2-6 interactions)",
        m.type, keys, params, bytes, gib(static_cast<double>(available_bytes))));
  }
}

double estimate_neighbor_pairs(const std::vector<Structure>& structures, double cutoff) {
  constexpr double kPi = 3.14159265358979323846;
  const double sphere = 4.0 / 3.0 * kPi * cutoff * cutoff * cutoff;
  double total = 0.0;
  for (const auto& s : structures) {
    const double n = static_cast<double>(s.num_atoms());
    if (n == 0) continue;
    double volume = 0.0;
    if (s.periodic()) {
      volume = s.volume();
    } else {
      const at::Tensor p = s.positions.to(at::kDouble);
      const at::Tensor extent = std::get<0>(p.max(0)) - std::get<0>(p.min(0)) + cutoff;
      volume = extent.prod().item<double>();
    }
    double per_atom = volume > 0 ? n / volume * sphere : n;
    if (!s.periodic()) per_atom = std::min(per_atom, n - 1);
    total += n * per_atom;
  }
  return total;
}

void check_neighbor_memory(const std::vector<Structure>& structures, double cutoff,
                           const std::string& file, int64_t available_bytes) {
  const double pairs = estimate_neighbor_pairs(structures, cutoff);
  const double bytes = 40.0 * pairs;
  if (bytes > 0.5 * static_cast<double>(available_bytes)) {
    throw DataError(fmt::format(
        "{}: with model.cutoff = {} Å the neighbor lists would hold about {:.2g} pairs ({:.2g} "
        "bytes), more than half of the {} of memory available; lower model.cutoff (typical: "
        "4-6 Å)",
        file, cutoff, pairs, bytes, gib(static_cast<double>(available_bytes))));
  }
}

}  // namespace crucible
