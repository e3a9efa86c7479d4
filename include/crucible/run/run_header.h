#pragma once
// The header a training run prints before its first batch: data and split,
// label counts, units, elements and E0s, scale/shift, the model's keys,
// loss, optimizer and schedule, updates, what model.pt holds, device,
// threads, memory and run directory (`crucible train`, `crucible.train`).

#include "crucible/run/training_setup.h"

#include <cstdint>
#include <filesystem>
#include <ostream>

namespace crucible {

/// Writes the header of the run `setup` to `out` (one "  key  value" line
/// per topic, after a "crucible train" line). `target_steps` is the
/// optimizer steps the run will take (TrainingStrategy::target_step_count).
/// @throws what the model registry throws for an unknown model.type (never
///         for a setup build_training made).
void write_run_header(std::ostream& out, const TrainingSetup& setup,
                      const std::filesystem::path& run_dir, int64_t target_steps);

}  // namespace crucible
