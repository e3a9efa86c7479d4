#pragma once
// Fine-tuning (issue 18): model.init_from starts a run from a trained model's
// weights; training.freeze keeps parameters matching a regex fixed.

#include "crucible/cli/model_io.h"
#include "crucible/models/energy_model.h"

#include <set>
#include <string>
#include <vector>

namespace crucible {

/// The model of model.init_from (a run directory or a model.pt with
/// model.json beside it). @throws ConfigError naming model.init_from if it
/// cannot be loaded or is of another type than `model_type`.
LoadedModel load_init_from(const std::string& path, const std::string& model_type);

/// Copies every parameter of `source` into the parameter of the same name
/// of `target` (buffers such as the energy normalization are not copied:
/// the new run fits its own). `new_elements` (Z, the fine-tuning data's
/// elements the source was not trained on) only change the message.
/// @throws ConfigError naming model.init_from and every parameter whose
///         shape differs or that either model lacks (with both shapes).
void initialize_from(EnergyModel& target, const EnergyModel& source, const std::string& path,
                     const std::vector<int64_t>& new_elements);

/// Qualified names ("main.<parameter>") of the parameters of `model` that
/// do NOT match `pattern` (std::regex_search on the parameter name): the
/// trainable set for training.freeze.
/// @throws ConfigError if the pattern is not a valid regex, or matches no
///         parameter (listing a few names).
std::set<std::string> trainable_parameters(EnergyModel& model, const std::string& pattern);

}  // namespace crucible
