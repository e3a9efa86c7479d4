// data.e0s (issue 18). See include/crucible/run/e0s.h.

#include "crucible/run/e0s.h"

#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/energy_normalization.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>

namespace crucible {

namespace {

std::string symbols(const std::vector<int64_t>& zs) { return element_symbols(zs, ", "); }

std::string symbols(const std::set<int64_t>& zs) { return symbols(std::vector<int64_t>(zs.begin(), zs.end())); }

/// Element → eV of a JSON file (keys: symbols or atomic numbers).
std::map<int64_t, double> read_e0_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError("data.e0s file " + path + " must be a readable JSON file, got a read error");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("data.e0s file " + path + " must be valid JSON, got " + e.what());
  }
  if (!j.is_object() || j.empty()) {
    throw ConfigError("data.e0s file " + path + " must hold a JSON object of element to eV, e.g. {\"Ti\": -2.1}");
  }
  std::map<int64_t, double> out;
  for (const auto& [key, value] : j.items()) {
    int64_t z = 0;
    try {
      z = !key.empty() && std::isdigit(static_cast<unsigned char>(key[0])) ? std::stoll(key) : atomic_number(key);
      (void)chemical_symbol(z);
    } catch (const std::exception&) {
      throw ConfigError("data.e0s file " + path + ": keys must be chemical symbols or atomic numbers, got \"" +
                        key.substr(0, 40) + "\"");
    }
    if (!value.is_number() || !std::isfinite(value.get<double>())) {
      throw ConfigError("data.e0s file " + path + ": " + key + " must be a finite number (eV), got " + value.dump());
    }
    out[z] = value.get<double>();
  }
  return out;
}

/// E0 of every training element from `given`, or an error naming the gaps.
at::Tensor complete(const std::map<int64_t, double>& given, const std::set<int64_t>& elements, const std::string& what) {
  std::vector<int64_t> missing;
  at::Tensor e0 = at::zeros({119}, at::kDouble);
  for (int64_t z : elements) {
    auto it = given.find(z);
    if (it == given.end()) {
      missing.push_back(z);
    } else {
      e0[z] = it->second;
    }
  }
  if (!missing.empty()) {
    std::vector<int64_t> have;
    for (const auto& [z, v] : given) have.push_back(z);
    throw ConfigError("data.e0s (" + what + ") has no E0 for " + symbols(missing) + ", an element of the training data (" +
                      symbols(elements) + "); given: " + (have.empty() ? std::string("none") : symbols(have)));
  }
  return e0;
}

}  // namespace

bool is_isolated_atom(const Structure& s) {
  if (s.config_type == "IsolatedAtom") return true;
  return s.num_atoms() == 1 && !s.periodic();
}

std::vector<Structure> take_isolated_atoms(std::vector<Structure>& frames) {
  std::vector<Structure> isolated, rest;
  for (auto& s : frames) (is_isolated_atom(s) ? isolated : rest).push_back(std::move(s));
  frames = std::move(rest);
  return isolated;
}

E0Choice choose_e0s(const E0Setting& setting, const std::vector<Structure>& train,
                    const std::vector<Structure>& isolated, const std::set<int64_t>& elements) {
  E0Choice c;
  if (setting.mode == "zero") {
    c.e0 = at::zeros({119}, at::kDouble);
    c.source = "zero";
  } else if (setting.mode == "map") {
    std::map<int64_t, double> given;
    for (const auto& [symbol, v] : setting.values) given[atomic_number(symbol)] = v;
    c.e0 = complete(given, elements, "map");
    c.source = "data.e0s map";
  } else if (setting.mode == "file") {
    c.e0 = complete(read_e0_file(setting.file), elements, "file " + setting.file);
    c.source = "file " + setting.file;
  } else if (setting.mode == "isolated") {
    std::map<int64_t, double> given;
    std::map<int64_t, std::string> where;
    for (const auto& s : isolated) {
      if (s.num_atoms() != 1) {
        throw ConfigError("data.e0s isolated: " + s.source + " has config_type=IsolatedAtom but " +
                          std::to_string(s.num_atoms()) + " atoms, expected 1");
      }
      if (!s.energy) throw ConfigError("data.e0s isolated: the isolated-atom frame " + s.source + " has no energy");
      const int64_t z = s.atomic_numbers[0].item<int64_t>();
      auto it = given.find(z);
      if (it != given.end() && std::abs(it->second - *s.energy) > 1e-6) {
        throw ConfigError(fmt::format("data.e0s isolated: two isolated {} atoms with different energies, {} eV ({}) "
                                      "and {} eV ({})", chemical_symbol(z), it->second, where[z], *s.energy, s.source));
      }
      given[z] = *s.energy;
      where.emplace(z, s.source);
    }
    try {
      c.e0 = complete(given, elements, "isolated");
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) +
                        "; isolated-atom frames have config_type=IsolatedAtom or one atom without periodicity");
    }
    std::string list;
    for (const auto& [z, w] : where) list += (list.empty() ? "" : ", ") + chemical_symbol(z) + " " + w;
    c.source = "isolated atoms (" + list + "; those frames are left out of training and validation)";
  } else {  // least_squares
    int64_t labelled = 0;
    for (const auto& s : train) labelled += s.energy.has_value();
    c.e0 = labelled > 0 ? fit_reference_energies(train, 118) : at::zeros({119}, at::kDouble);
    c.source = labelled > 0 ? fmt::format("least_squares fit on {} training energies", labelled)
                            : "zero (no training energies to fit)";
    const std::vector<int64_t> mixed = labelled > 0 ? inseparable_elements(train) : std::vector<int64_t>{};
    if (!mixed.empty()) {
      std::string values;
      for (int64_t z : mixed) values += fmt::format("{}{}: {:.4f}", values.empty() ? "" : ", ", chemical_symbol(z), c.e0[z].item<double>());
      c.source += " (minimum-norm solution: " + symbols(mixed) + " not separable)";
      c.warning = "data.e0s least_squares cannot separate the reference energies of " + symbols(mixed) +
                  ": every training structure has them in the same proportions, so NumPy's minimum-norm solution "
                  "is used ({" + values + "} eV) and predictions for other compositions depend on that choice; "
                  "set data.e0s: isolated (frames with config_type=IsolatedAtom) or a map of element to eV";
    }
  }
  for (int64_t z : elements) {
    if (!std::isfinite(c.e0[z].item<double>())) {
      throw ConfigError("data.e0s (" + setting.mode + ") gives a non-finite E0 for " + chemical_symbol(z));
    }
  }
  return c;
}

}  // namespace crucible
