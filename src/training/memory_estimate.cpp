// The estimated peak memory of a training run. See
// include/crucible/training/memory_estimate.h and docs/training_memory.md.

#include "crucible/training/memory_estimate.h"

#include "crucible/common/error.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>

namespace crucible {

namespace {

std::string gb(double bytes) { return fmt::format("{:.2f}", bytes / 1e9); }

}  // namespace

double training_state_copies(const std::string& optimizer, bool amsgrad, double momentum, bool centered, bool ema) {
  double moments = 0;
  if (optimizer == "adam" || optimizer == "adamw") {
    moments = amsgrad ? 3 : 2;
  } else if (optimizer == "sgd") {
    moments = momentum > 0 ? 1 : 0;
  } else if (optimizer == "rmsprop") {
    moments = 1 + (centered ? 1 : 0) + (momentum > 0 ? 1 : 0);
  } else if (optimizer == "adagrad") {
    moments = 1;
  } else {
    throw std::invalid_argument("training.optimizer.name must be adam, adamw, sgd, rmsprop or adagrad, got '" +
                                optimizer + "'");
  }
  const double live = 2 + moments + (ema ? 1 : 0) + 1;  // weights, gradients, moments, EMA, best copy
  const double checkpoint = 2 + moments + (ema ? 1 : 0);
  return live + checkpoint + 3.5;
}

double largest_batch_activations(const ActivationEstimate& a, double scale, double dtype_size,
                                 const std::vector<int64_t>& edges, const std::vector<int64_t>& atoms,
                                 const std::vector<std::vector<int64_t>>& batches) {
  double largest = 0;
  for (const auto& batch : batches) {
    double e = 0, n = 0;
    for (int64_t i : batch) {
      e += static_cast<double>(edges.at(static_cast<size_t>(i)));
      n += static_cast<double>(atoms.at(static_cast<size_t>(i)));
    }
    largest = std::max(largest, a.per_edge * e + a.per_atom * n);
  }
  return scale * dtype_size * largest;
}

std::string MemoryEstimate::describe(int64_t available_bytes) const {
  return fmt::format(
      "about {} GB at peak (process {}, structures {}, neighbor lists {}, weights/gradients/optimizer {} "
      "({:g} copies), activations {} for the largest batch{}) of {} GB",
      gb(total()), gb(process), gb(structures), gb(neighbor_lists), gb(training_state), state_copies,
      gb(activations), not_counted.empty() ? std::string() : "; not counted: " + not_counted,
      gb(process + static_cast<double>(available_bytes)));
}

int64_t resident_memory_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return resident * (page > 0 ? page : 4096);
}

void check_training_memory(const MemoryEstimate& e, int64_t available_bytes, const std::string& model_type) {
  if (e.total() - e.process <= static_cast<double>(available_bytes)) return;
  // The largest part names the setting that lowers it.
  const double parts[] = {e.activations, e.training_state, e.neighbor_lists + e.structures};
  const auto largest = std::max_element(std::begin(parts), std::end(parts)) - std::begin(parts);
  const char* fix[] = {"lower training.batch_size / training.valid_batch_size (the activations grow with the "
                       "atoms and pairs of a batch)",
                       "choose smaller model.", "lower model.cutoff or train on fewer structures"};
  std::string hint = fix[largest];
  if (largest == 1) hint += model_type + " values (fewer channels or interactions)";
  throw ConfigError("training would need " + e.describe(available_bytes) + "; " + hint);
}

}  // namespace crucible
