// Missing label keys (issue 18). See include/crucible/run/label_keys.h.

#include "crucible/run/label_keys.h"

#include <algorithm>
#include <cctype>
#include <set>

namespace crucible {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string join(const std::set<std::string>& items, size_t at_most) {
  std::string out;
  size_t n = 0;
  for (const auto& s : items) {
    if (n++ == at_most) return out + ", ... (" + std::to_string(items.size()) + " in all)";
    out += (out.empty() ? "" : ", ") + s;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

const std::vector<std::string>& mace_label_names(LabelKind kind) {
  static const std::vector<std::string> energy{"REF_energy", "dft_energy", "DFT_energy", "energy", "Energy",
                                               "free_energy", "total_energy", "TotEnergy", "E"};
  static const std::vector<std::string> forces{"REF_forces", "dft_forces", "DFT_forces", "forces", "force",
                                               "dft_force", "REF_force", "Forces", "F"};
  return kind == LabelKind::kEnergy ? energy : forces;
}

std::string missing_label_message(const std::vector<Structure>& structures, const std::string& path, LabelKind kind,
                                  const DataConfig& data) {
  std::set<std::string> keys;
  for (const auto& s : structures) {
    if (kind == LabelKind::kEnergy) {
      for (const auto& [k, v] : s.info) keys.insert(k);
    } else {
      for (const auto& c : s.columns) keys.insert(c);
    }
  }
  const bool energy = kind == LabelKind::kEnergy;
  const std::string setting = energy ? "data.energy_key" : "data.forces_key";
  const std::string key = energy ? data.energy_key : (data.forces_key.empty() ? "forces" : data.forces_key);
  std::string text = path + ": no frame has the " + (energy ? "energy key '" : "forces column '") + key + "'" +
                     (energy || !data.forces_key.empty() ? "" : " (or 'force')") + " (" + setting + "); its " +
                     (energy ? "header keys are " : "Properties columns are ") + join(keys, 20);
  std::string match;
  for (const auto& name : mace_label_names(kind)) {
    for (const auto& k : keys) {
      if (match.empty() && lower(k) == lower(name)) match = k;
    }
  }
  const bool mace_name = !match.empty();
  if (match.empty() && energy) {  // e.g. "REF_energy_PBE": any key that names an energy
    for (const auto& k : keys)
      if (match.empty() && lower(k).find("energy") != std::string::npos) match = k;
  }
  if (match.empty() && !energy) {
    for (const auto& k : keys)
      if (match.empty() && lower(k).find("force") != std::string::npos) match = k;
  }
  if (!match.empty()) {
    text += "; set " + setting + "=" + match + (mace_name ? std::string(" (one of MACE's names for the ") + (energy ? "energy)" : "forces)") : "");
  } else {
    text += "; MACE's names would be " + std::string(energy ? "REF_energy, dft_energy, energy" : "REF_forces, dft_forces, forces");
  }
  return text;
}

}  // namespace crucible
