// Labels found or refused (issue 47). See include/crucible/data/label_audit.h.

#include "crucible/data/label_audit.h"

#include "crucible/common/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <set>

namespace crucible {

namespace {

std::vector<std::string> words_of(const std::string& key) {
  std::vector<std::string> words(1);
  for (char c : key) {
    if (c == '_' || c == '-' || c == '.' || c == ' ') {
      if (!words.back().empty()) words.emplace_back();
    } else {
      words.back() += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

std::string setting_of(const std::string& label) {
  return label == "forces" ? "data.forces_key" : "data." + label + "_key";
}

bool has_label(const Structure& s, const std::string& label) {
  if (label == "energy") return s.energy.has_value();
  if (label == "forces") return s.forces.has_value();
  return s.stress.has_value();  // stress and virial both end as stress
}

}  // namespace

std::string label_of_key(const std::string& key) {
  // Predictions, per-atom values, weights and DFT settings (gap_fit's
  // energy_sigma, a plane-wave energy_cutoff) are not labels.
  static const std::set<std::string> not_labels{
      "mace",  "crucible", "pred",  "predicted", "model",     "per",       "atom",  "atomic", "atoms",
      "weight", "weights", "std",   "e0",        "e0s",       "error",     "sigma", "cutoff", "tol",
      "tolerance", "threshold", "smearing", "delta", "unit",  "units",     "method"};
  static const std::map<std::string, std::string> words{
      {"energy", "energy"}, {"totenergy", "energy"}, {"forces", "forces"},   {"force", "forces"},
      {"stress", "stress"}, {"stresses", "stress"},  {"virial", "virial"},   {"virials", "virial"}};
  std::string label;
  for (const auto& w : words_of(key)) {
    if (not_labels.count(w)) return "";
    const auto it = words.find(w);
    if (it != words.end() && label.empty()) label = it->second;
  }
  return label;
}

std::vector<UnreadLabel> find_unread_labels(const std::vector<Structure>& structures, const ExtxyzOptions& keys) {
  const std::array<std::string, 4> labels{"energy", "forces", "stress", "virial"};
  const std::map<std::string, std::string> settings{{"energy", keys.energy_key},
                                                    {"forces", keys.forces_key},
                                                    {"stress", keys.stress_key},
                                                    {"virial", keys.virial_key}};
  std::map<std::pair<size_t, std::string>, UnreadLabel> found;
  auto consider = [&](const Structure& s, const std::string& key, bool column) {
    const std::string label = label_of_key(key);
    if (label.empty() || settings.at(label) == kNoLabelKey || has_label(s, label)) return;
    if (label == "forces" && !column) return;  // forces are per atom: a column
    const size_t order = static_cast<size_t>(std::find(labels.begin(), labels.end(), label) - labels.begin());
    UnreadLabel& u = found[{order, key}];
    if (u.frames++ == 0) {
      u.label = label;
      u.key = key;
      u.setting = setting_of(label);
      u.first = s.source;
    }
  };
  for (const auto& s : structures) {
    std::set<std::string> seen;  // a name both in info and columns counts once per frame
    for (const auto& [key, value] : s.info) {
      if (seen.insert(key).second) consider(s, key, false);
    }
    for (const auto& c : s.columns) {
      if (seen.insert(c).second) consider(s, c, true);
    }
  }
  std::vector<UnreadLabel> out;
  for (auto& [k, u] : found) out.push_back(std::move(u));
  return out;
}

std::string describe_unread_labels(const std::string& path, const std::vector<UnreadLabel>& findings, int64_t total) {
  std::string text;
  for (const auto& u : findings) {
    // "PATH:2" -> "line 2", "PATH id 3" -> "id 3": the path leads the message once.
    std::string first = u.first;
    if (!path.empty() && first.size() > path.size() + 1 && first.compare(0, path.size(), path) == 0) {
      first = (first[path.size()] == ':' ? "line " : "") + first.substr(path.size() + 1);
    }
    text += fmt::format("{}{} under '{}' in {} of {} frame{} ({}set {}={})", text.empty() ? "" : ", ", u.label, u.key,
                        u.frames, total, total == 1 ? "" : "s", first.empty() ? "" : "first at " + first + "; ",
                        u.setting, u.key);
  }
  return text.empty() ? text : path + ": " + text;
}

void LabelAudit::add(const std::string& path, const std::vector<Structure>& structures, const ExtxyzOptions& keys) {
  const std::string text =
      describe_unread_labels(path, find_unread_labels(structures, keys), static_cast<int64_t>(structures.size()));
  if (!text.empty()) files_.push_back(text);
}

void LabelAudit::throw_if_any() const {
  if (files_.empty()) return;
  std::string text;
  for (const auto& f : files_) text += (text.empty() ? "" : "; ") + f;
  throw DataError("labels under keys the settings do not name: " + text +
                  "; set the key, or data.<label>_key=none to leave a label out on purpose");
}

std::string label_counts_text(const std::vector<Structure>& structures) {
  int64_t e = 0, f = 0, s = 0;
  for (const auto& x : structures) {
    e += x.energy.has_value();
    f += x.forces.has_value();
    s += x.stress.has_value();
  }
  return fmt::format("energy {}, forces {}, stress {}", e, f, s);
}

}  // namespace crucible
