#pragma once
// Fine-tuning (issue 18): model.init_from starts a run from a trained model's
// weights; training.freeze keeps parameters matching a regex fixed.

#include "crucible/run/e0s.h"
#include "crucible/run/model_io.h"
#include "crucible/config/config.h"
#include "crucible/data/structure.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/mace/mace_import.h"

#include <set>
#include <string>
#include <vector>

namespace crucible {

/// The model of model.init_from: a run directory or a model.pt with
/// model.json beside it, or a MACE file (issue 46), imported on the fly
/// (crucible/models/mace/mace_import.h): a `_compiled.model` (TorchScript),
/// or a `.pt` state_dict with its hyper-parameters beside it as the same
/// name with `.json` (what `python3 -m crucible.mace_to_pt` writes).
/// @throws ConfigError naming model.init_from if it cannot be loaded or
///         imported, or is of another type than `model_type`.
LoadedModel load_init_from(const std::string& path, const std::string& model_type);

/// The model.json record of a model imported from MACE (issue 46): type
/// mace, the model's hyper-parameters and dtype, its elements, E0s ("MACE
/// file"), scale, shift and origin. Never throws.
ModelMetadata imported_metadata(const ImportedMace& imported);

/// True for a source whose architecture cannot be rebuilt from the config
/// (an imported MACE model: its tables come from its file), so the run
/// trains a copy of it. Never throws.
bool is_imported_model(const EnergyModel& model);

/// The run's model for an imported source: a copy of it (architecture,
/// tables, weights). `defaults` are the config keys' defaults, so that a
/// key that differs from both its default and the source must have been
/// set by the user.
/// @throws ConfigError naming model.init_from: elements of the training data
///         the source lacks (naming them: an imported model cannot grow its
///         element list), model.cutoff or a model.<type>.* value set to
///         something other than the source's (naming the key and both values).
std::shared_ptr<EnergyModel> copy_of_imported_model(const LoadedModel& source, const ModelConfig& config,
                                                    const ModelConfig& defaults, const std::set<int64_t>& elements,
                                                    const std::string& path);

/// data.e0s foundation / estimated for a fine-tuning run (issue 46; MACE's
/// E0s="foundation" / "estimated"):
/// - foundation: the source model's E0s;
/// - estimated: the source's E0s plus δ, the least-squares (minimum-norm,
///   LAPACK gelsd) solution of counts · δ ≈ E_ref − E_source over the
///   training structures with an energy (E_source: the source model's
///   predictions, neighbour lists at its cutoff), so that the source model
///   starts with no mean energy error per composition on the new data.
/// @throws ConfigError naming data.e0s: an element of `elements` the source
///         has no E0 for.
E0Choice source_e0s(const E0Setting& setting, const LoadedModel& source, const std::vector<Structure>& train,
                    const std::set<int64_t>& elements);

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
