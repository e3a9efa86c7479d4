#pragma once
// Messages for label keys that match nothing in a data file (issue 18): the
// keys the file does have, and which of MACE's names would match.

#include "crucible/config/config.h"
#include "crucible/data/structure.h"

#include <string>
#include <vector>

namespace crucible {

/// Which label: "energy" (header key, data.energy_key) or "forces"
/// (Properties column, data.forces_key).
enum class LabelKind { kEnergy, kForces };

/// One line for a data file none of whose frames has the `kind` label under
/// the configured key: "PATH: no frame has the energy key 'energy'
/// (data.energy_key); its header keys are config_type, dft_energy, ...;
/// set data.energy_key=dft_energy (a MACE name for the energy)". Lists at
/// most 20 keys. `structures` as read from `path`. Never throws.
std::string missing_label_message(const std::vector<Structure>& structures, const std::string& path, LabelKind kind,
                                  const DataConfig& data);

/// MACE's names for a label, in order of preference (REF_energy,
/// dft_energy, energy, ...; REF_forces, dft_forces, forces, force, ...).
const std::vector<std::string>& mace_label_names(LabelKind kind);

}  // namespace crucible
