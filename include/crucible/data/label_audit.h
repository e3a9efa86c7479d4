#pragma once
// Labels found or refused, never dropped (issue 47): after a file is read,
// the keys it holds that the settings did not name are checked against the
// field's names for energy, forces, stress and virial (MACE, NequIP, ASE,
// DeePMD). A frame without a label that holds such a key is a finding; the
// caller reports every finding of every file in one message.
// Design note: docs/data/labels.md.

#include "crucible/data/extxyz.h"
#include "crucible/data/structure.h"

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

/// The value of a data.<label>_key that leaves the label out on purpose.
inline constexpr const char* kNoLabelKey = "none";

/// A label held under a key the settings do not name.
struct UnreadLabel {
  std::string label;    ///< "energy", "forces", "stress" or "virial".
  std::string key;      ///< the file's key or column, e.g. "dft_stress".
  std::string setting;  ///< the setting that would read it, e.g. "data.stress_key".
  int64_t frames = 0;   ///< frames that hold `key` and lack the label.
  std::string first;    ///< Structure::source of the first such frame ("" if unknown).
};

/// Which label the name `key` holds, by the field's names: "energy" for
/// energy, free_energy, total_energy, REF_energy, dft_energy, TotEnergy,
/// REF_energy_PBE (an underscore-separated word "energy"); "forces" for
/// forces / force words (MACE REF_forces, DeePMD force); "stress" and
/// "virial" likewise (REF_stress, dft_virial, virials). Names of predictions
/// (a word MACE, crucible, pred, predicted, model), of per-atom or weight
/// values (per, atom, atomic, atoms, weight, std, e0, e0s, error) and of DFT
/// settings (sigma as gap_fit's energy_sigma, cutoff, tol, smearing, ...)
/// hold none: "".
/// Case-insensitive; words are split at '_', '-', '.' and ' '.
std::string label_of_key(const std::string& key);

/// The findings in `structures`: for each label whose setting in `keys` is
/// not "none", the header keys (Structure::info) and stored columns
/// (Structure::columns) named for that label in frames that lack it (energy
/// for "energy"; forces; stress for "stress" and "virial"). Forces are looked
/// for in columns only. One entry per (label, key), in label order energy,
/// forces, stress, virial, then key order.
std::vector<UnreadLabel> find_unread_labels(const std::vector<Structure>& structures, const ExtxyzOptions& keys);

/// "PATH: energy under 'dft_energy' in 3 of 10 frames (first at line 2; set
/// data.energy_key=dft_energy), forces under ..." for `findings` of a file
/// of `total` frames; "" when there is none.
std::string describe_unread_labels(const std::string& path, const std::vector<UnreadLabel>& findings, int64_t total);

/// Collects the findings of several files and throws them in one message.
class LabelAudit {
 public:
  /// Audits one file's `structures` read with `keys`.
  void add(const std::string& path, const std::vector<Structure>& structures, const ExtxyzOptions& keys);
  /// @throws DataError "labels under keys the settings do not name: <file
  ///   findings joined by '; '>; set the key, or data.<label>_key=none to
  ///   leave a label out on purpose" when any file had a finding.
  void throw_if_any() const;

 private:
  std::vector<std::string> files_;
};

/// "energy 10, forces 10, stress 0" for `structures` (frames holding each).
std::string label_counts_text(const std::vector<Structure>& structures);

}  // namespace crucible
