// YAML configuration: one schema table drives loading, command-line
// overrides, validation, dumping and documentation.

#include "crucible/config/config.h"
#include "mace_names.h"
#include "schema.h"

#include "crucible/common/error.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/registry.h"
#include "crucible/losses/loss.h"
#include "crucible/losses/loss_weight_schedule.h"
#include "crucible/training/lr_scheduler.h"
#include "crucible/training/metrics.h"
#include "crucible/training/optimizers.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace crucible {
namespace {

// ---------------------------------------------------------------- units ----

// CODATA 2018. Faraday constant N_A·e (C/mol) is exact since the 2019 SI.
constexpr double kFaraday = 96485.33212331001;
constexpr double kKJPerMol = 1000.0 / kFaraday;   // eV
constexpr double kKcalPerMol = 4184.0 / kFaraday; // eV
constexpr double kHartree = 27.211386245988;      // eV
constexpr double kRydberg = kHartree / 2.0;       // eV
constexpr double kBohr = 0.529177210903;          // Å
constexpr double kGPa = 1.0 / 160.21766339999996; // eV/Å³ (1 eV/Å³ = 160.2176634 GPa)

std::string ascii_lower(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

const std::vector<std::pair<std::string, double>>& energy_units() {
  static const std::vector<std::pair<std::string, double>> table = {
      {"eV", 1.0},          {"meV", 1e-3},       {"kcal/mol", kKcalPerMol},
      {"kJ/mol", kKJPerMol}, {"Hartree", kHartree}, {"Ha", kHartree},
      {"Ry", kRydberg},     {"Rydberg", kRydberg}};
  return table;
}

std::optional<double> energy_factor(const std::string& text) {
  const std::string t = ascii_lower(text);
  for (const auto& [name, f] : energy_units()) {
    if (ascii_lower(name) == t) return f;
  }
  return std::nullopt;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Splits "<energy>/<length suffix>" with one of `suffixes` (lower case);
/// returns the energy factor divided by length^power.
std::optional<double> energy_per_length(const std::string& text,
                                        const std::vector<std::pair<std::string, double>>& suffixes) {
  const std::string t = ascii_lower(text);
  for (const auto& [suffix, divisor] : suffixes) {
    if (!ends_with(t, suffix)) continue;
    const auto e = energy_factor(text.substr(0, text.size() - suffix.size()));
    if (e) return *e / divisor;
  }
  return std::nullopt;
}

}  // namespace

std::optional<double> named_unit_factor(UnitQuantity quantity, const std::string& text) {
  const std::string a = "\xC3\x85";  // Å (UTF-8); ascii_lower leaves it alone.
  switch (quantity) {
    case UnitQuantity::kEnergy:
      return energy_factor(text);
    case UnitQuantity::kForces:
      return energy_per_length(text, {{"/" + a, 1.0},
                                      {"/a", 1.0},
                                      {"/ang", 1.0},
                                      {"/angstrom", 1.0},
                                      {"/bohr", kBohr}});
    case UnitQuantity::kStress: {
      const std::string t = ascii_lower(text);
      if (t == "gpa") return kGPa;
      if (t == "kbar") return 0.1 * kGPa;
      const double b3 = kBohr * kBohr * kBohr;
      return energy_per_length(text, {{"/" + a + "^3", 1.0},
                                      {"/" + a + "\xC2\xB3", 1.0},
                                      {"/" + a + "3", 1.0},
                                      {"/a^3", 1.0},
                                      {"/a3", 1.0},
                                      {"/ang^3", 1.0},
                                      {"/angstrom^3", 1.0},
                                      {"/bohr^3", b3},
                                      {"/bohr3", b3}});
    }
  }
  return std::nullopt;
}

std::vector<std::string> unit_names(UnitQuantity quantity) {
  switch (quantity) {
    case UnitQuantity::kEnergy:
      return {"eV", "meV", "kcal/mol", "kJ/mol", "Hartree", "Ry"};
    case UnitQuantity::kForces:
      return {"eV/Å", "eV/A", "meV/Å", "kcal/mol/Å", "kJ/mol/Å", "Hartree/Bohr", "Ry/Bohr",
              "Hartree/Å"};
    case UnitQuantity::kStress:
      return {"eV/Å^3", "eV/A^3", "kcal/mol/Å^3", "Hartree/Bohr^3", "GPa", "kbar"};
  }
  return {};
}

std::string UnitSetting::to_string() const {
  if (!name.empty()) return name;
  return fmt::format("{}", factor);
}

namespace {

// --------------------------------------------------------------- schema ----

using config_schema::Key;
using config_schema::Kind;

template <class T>
T& as(void* p) {
  return *static_cast<T*>(p);
}

std::vector<Key> build_schema() {
  config_schema::KeyTable t;
  config_schema::add_data_keys(t);
  config_schema::add_model_keys(t);
  config_schema::add_training_loop_keys(t);
  config_schema::add_optimizer_keys(t);
  config_schema::add_update_keys(t);
  config_schema::add_loss_keys(t);
  config_schema::add_training_run_keys(t);
  config_schema::add_output_keys(t);
  return std::move(t.keys);
}

const std::vector<Key>& schema() {
  static const std::vector<Key> s = build_schema();
  return s;
}

const Key* find_key(const std::string& path) {
  for (const auto& key : schema()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

bool is_section(const std::string& path) {
  const std::string prefix = path + ".";
  for (const auto& key : schema()) {
    if (key.path.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return path.empty();
}

/// Immediate children ("training.optimizer", "training.seed", ...) of a section.
std::vector<std::string> children(const std::string& section) {
  const std::string prefix = section.empty() ? "" : section + ".";
  std::vector<std::string> out;
  for (const auto& key : schema()) {
    if (key.path.compare(0, prefix.size(), prefix) != 0) continue;
    const auto dot = key.path.find('.', prefix.size());
    std::string child = dot == std::string::npos ? key.path : key.path.substr(0, dot);
    if (std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
  }
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// ------------------------------------------------------- value parsing ----

/// Where a value came from, for messages: " in cfg.yaml (line 7)".
struct Source {
  std::string name;
  bool is_override = false;  // no line numbers for command-line overrides

  std::string where(const YAML::Node& node) const {
    if (is_override) return " in " + name;
    const YAML::Mark m = node.Mark();
    if (m.line >= 0) return " in " + name + " (line " + std::to_string(m.line + 1) + ")";
    return " in " + name;
  }
};

// A user's text for a message: at most 80 bytes, anything but printable
// ASCII as \xNN.
std::string printable(const std::string& v) {
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(v.size(), 77); ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  if (v.size() > 77) out += "...";
  return out;
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return (node.Tag() == "!" ? "the string '" : "'") + printable(node.Scalar()) + "'";
    default:
      return "an undefined value";
  }
}

[[noreturn]] void type_error(const Key& key, const std::string& expected, const YAML::Node& node,
                             const Source& src) {
  throw ConfigError(key.path + " must be " + expected + ", got " + describe(node) +
                    src.where(node));
}

bool is_plain_scalar(const YAML::Node& node) {
  return node.IsScalar() && node.Tag() != "!";
}

std::optional<int64_t> parse_int(const std::string& s) {
  static const std::regex re("[-+]?[0-9]+");
  if (!std::regex_match(s, re)) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> parse_float(const std::string& s) {
  static const std::regex re("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  if (!std::regex_match(s, re)) return std::nullopt;
  const double v = std::strtod(s.c_str(), nullptr);
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& s) {
  const std::string t = ascii_lower(s);
  if (t == "true" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "no" || t == "off") return false;
  return std::nullopt;
}

/// Shortest text that reads back as `v` (for messages).
std::string display_number(double v) { return fmt::format("{}", v); }

/// Shortest round-trip text of a float, always with a '.' (YAML 1.1 floats).
std::string format_number(double v) {
  std::string s = display_number(v);
  // YAML 1.1 readers (PyYAML) need a '.' in a float: 1e-08 → 1.0e-08, 5 → 5.0.
  if (s.find_first_of(".") == std::string::npos && s.find("inf") == std::string::npos &&
      s.find("nan") == std::string::npos) {
    const auto e = s.find_first_of("eE");
    if (e == std::string::npos) {
      s += ".0";
    } else {
      s.insert(e, ".0");
    }
  }
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned char>(c));
          out += b;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string bound_text(const Key& key, double v) {
  const bool integral = key.kind == Kind::kInt || key.kind == Kind::kOptInt;
  return integral ? std::to_string(static_cast<int64_t>(v)) : display_number(v);
}

std::string describe_range(const Key& key) {
  if (key.min && key.max) {
    return std::string("in ") + (key.min_exclusive ? "(" : "[") + bound_text(key, *key.min) +
           ", " + bound_text(key, *key.max) + (key.max_inclusive ? "]" : ")");
  }
  if (key.min) return std::string(key.min_exclusive ? "> " : ">= ") + bound_text(key, *key.min);
  if (key.max) return std::string(key.max_inclusive ? "<= " : "< ") + bound_text(key, *key.max);
  return "";
}

/// Range check of one value; returns the error text or "".
std::string check_range(const Key& key, double v) {
  bool ok = true;
  if (key.min) ok = ok && (key.min_exclusive ? v > *key.min : v >= *key.min);
  if (key.max) ok = ok && (key.max_inclusive ? v <= *key.max : v < *key.max);
  if (ok) return "";
  const bool integral = key.kind == Kind::kInt || key.kind == Kind::kOptInt;
  return key.path + " must be " + (integral ? "an integer " : "a number ") + describe_range(key) +
         ", got " + bound_text(key, v);
}

std::string check_choice(const Key& key, const std::string& v) {
  if (key.choices.empty() ||
      std::find(key.choices.begin(), key.choices.end(), v) != key.choices.end()) {
    return "";
  }
  return key.path + " must be one of " + join(key.choices, ", ") + ", got '" + v + "'";
}

/// Parses a unit setting; "" on success, else the error (without location).
std::string parse_unit(const Key& key, const YAML::Node& node, UnitSetting* out) {
  const std::string names = join(unit_names(key.unit_quantity), ", ");
  const std::string expected = "a number > 0 or a unit name (" + names + ")";
  if (!node.IsScalar()) return key.path + " must be " + expected + ", got " + describe(node);
  const std::string text = node.Scalar();
  if (is_plain_scalar(node)) {
    if (auto v = parse_float(text)) {
      if (!(*v > 0.0)) return key.path + " must be " + expected + ", got " + text;
      *out = UnitSetting{"", *v};
      return "";
    }
  }
  if (auto f = named_unit_factor(key.unit_quantity, text)) {
    *out = UnitSetting{text, *f};
    return "";
  }
  return key.path + " must be " + expected + ", got '" + text + "'";
}

/// Tracks which of num_epochs / num_steps one layer (file, override list) set.
struct LayerState {
  std::string epochs_where, steps_where;
};

void set_value(Config& config, const Key& key, const YAML::Node& node, const Source& src,
               LayerState& layer) {
  void* p = key.ref(config);
  auto fail = [&](const std::string& msg) { throw ConfigError(msg + src.where(node)); };
  switch (key.kind) {
    case Kind::kString:
    case Kind::kOptString: {
      if (key.kind == Kind::kOptString && node.IsNull()) {
        as<std::optional<std::string>>(p).reset();
        return;
      }
      if (!node.IsScalar()) {
        type_error(key, key.kind == Kind::kOptString ? "a string or null" : "a string", node, src);
      }
      const std::string& v = node.Scalar();
      if (v.size() > kMaxConfigStringLength) {
        fail(key.path + " must be at most " + std::to_string(kMaxConfigStringLength) +
             " characters, got " + std::to_string(v.size()));
      }
      if (auto e = check_choice(key, v); !e.empty()) fail(e);
      if (key.kind == Kind::kString) {
        as<std::string>(p) = v;
      } else {
        as<std::optional<std::string>>(p) = v;
      }
      return;
    }
    case Kind::kInt:
    case Kind::kOptInt: {
      const bool opt = key.kind == Kind::kOptInt;
      if (opt && node.IsNull()) {
        as<std::optional<int64_t>>(p).reset();
        return;
      }
      const std::string expected = opt ? "an integer or null" : "an integer";
      if (!is_plain_scalar(node)) type_error(key, expected, node, src);
      const auto v = parse_int(node.Scalar());
      if (!v) type_error(key, expected, node, src);
      if (auto e = check_range(key, static_cast<double>(*v)); !e.empty()) fail(e);
      if (opt) {
        as<std::optional<int64_t>>(p) = *v;
        if (key.path == "training.num_epochs") layer.epochs_where = src.where(node);
        if (key.path == "training.num_steps") layer.steps_where = src.where(node);
      } else {
        as<int64_t>(p) = *v;
      }
      return;
    }
    case Kind::kFloat: {
      if (!is_plain_scalar(node)) type_error(key, "a number", node, src);
      const auto v = parse_float(node.Scalar());
      if (!v) type_error(key, "a finite number", node, src);
      if (auto e = check_range(key, *v); !e.empty()) fail(e);
      as<double>(p) = *v;
      return;
    }
    case Kind::kBool: {
      if (!is_plain_scalar(node)) type_error(key, "a boolean (true or false)", node, src);
      const auto v = parse_bool(node.Scalar());
      if (!v) type_error(key, "a boolean (true or false)", node, src);
      as<bool>(p) = *v;
      return;
    }
    case Kind::kUnit: {
      UnitSetting u;
      if (auto e = parse_unit(key, node, &u); !e.empty()) fail(e);
      as<UnitSetting>(p) = u;
      return;
    }
    case Kind::kIntList: {
      const std::string expected = "a list of integers, e.g. [64, 64, 64]";
      if (!node.IsSequence()) type_error(key, expected, node, src);
      std::vector<int64_t> out;
      for (const auto& item : node) {
        if (!is_plain_scalar(item)) type_error(key, expected, node, src);
        const auto v = parse_int(item.Scalar());
        if (!v) type_error(key, expected, node, src);
        if (!check_range(key, static_cast<double>(*v)).empty()) {
          fail(key.path + " entries must be integers " + describe_range(key) + ", got " + std::to_string(*v));
        }
        out.push_back(*v);
      }
      if (out.size() > 64) fail(key.path + " must have at most 64 entries, got " + std::to_string(out.size()));
      as<std::vector<int64_t>>(p) = std::move(out);
      return;
    }
    case Kind::kE0s: {
      const std::string expected =
          "least_squares (MACE: average), isolated, zero, foundation, estimated, a JSON file (*.json) or a map of "
          "element to eV, e.g. {Ti: -2.1, Al: -3.4}";
      E0Setting out;
      if (node.IsScalar()) {
        const std::string& v = node.Scalar();
        if (v == "least_squares" || v == "isolated" || v == "zero" || v == "foundation" || v == "estimated") {
          out.mode = v;
        } else if (v == "average") {  // MACE's name for its least-squares fit
          out.mode = "least_squares";
        } else if (v.size() > 5 && v.compare(v.size() - 5, 5, ".json") == 0 && v.size() <= kMaxConfigStringLength) {
          out.mode = "file";
          out.file = v;
        } else {
          type_error(key, expected, node, src);
        }
      } else if (node.IsMap()) {
        out.mode = "map";
        for (const auto& kv : node) {
          if (!kv.first.IsScalar()) type_error(key, expected, node, src);
          const std::string name = kv.first.Scalar();
          std::string symbol;
          try {
            const auto z = parse_int(name);
            symbol = z ? chemical_symbol(*z) : chemical_symbol(atomic_number(name));
          } catch (const DataError&) {
            throw ConfigError(key.path + " keys must be chemical symbols or atomic numbers, got '" +
                              name.substr(0, 40) + "'" + src.where(kv.first));
          }
          const std::string entry = key.path + "." + symbol;
          const auto v = is_plain_scalar(kv.second) ? parse_float(kv.second.Scalar()) : std::nullopt;
          if (!v) throw ConfigError(entry + " must be a finite number (eV), got " + describe(kv.second) + src.where(kv.second));
          if (!out.values.emplace(symbol, *v).second) {
            throw ConfigError("duplicate key '" + entry + "'" + src.where(kv.first));
          }
        }
        if (out.values.empty()) type_error(key, expected, node, src);
      } else {
        type_error(key, expected, node, src);
      }
      as<E0Setting>(p) = std::move(out);
      return;
    }
    case Kind::kWeightMap: {
      const std::string expected = "a mapping of names to numbers >= 0, e.g. {bulk: 2.0}";
      if (node.IsNull()) {
        as<std::map<std::string, double>>(p).clear();
        return;
      }
      if (!node.IsMap()) type_error(key, expected, node, src);
      std::map<std::string, double> out;
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) type_error(key, expected, node, src);
        const std::string name = kv.first.Scalar();
        if (name.size() > kMaxConfigStringLength) {
          throw ConfigError(key.path + " names must be at most " + std::to_string(kMaxConfigStringLength) +
                            " characters, got " + std::to_string(name.size()) + src.where(kv.first));
        }
        const std::string entry = key.path + "." + name;
        if (!is_plain_scalar(kv.second)) {
          throw ConfigError(entry + " must be a number >= 0, got " + describe(kv.second) +
                            src.where(kv.second));
        }
        const auto v = parse_float(kv.second.Scalar());
        if (!v || !(*v >= 0.0)) {
          throw ConfigError(entry + " must be a finite number >= 0, got " +
                            kv.second.Scalar() + src.where(kv.second));
        }
        if (!out.emplace(name, *v).second) {
          throw ConfigError("duplicate key '" + entry + "'" + src.where(kv.first));
        }
      }
      as<std::map<std::string, double>>(p) = std::move(out);
      return;
    }
  }
}

/// "model.schnet.hidden_channels" (or both candidates) for an old flat
/// model key such as "model.hidden_channels"; "" otherwise.
std::string moved_model_key(const std::string& path) {
  if (path.rfind("model.", 0) != 0 || std::count(path.begin(), path.end(), '.') != 1) return "";
  const std::string leaf = path.substr(6);
  std::string out;
  for (const auto& f : model_registry())
    for (const auto& k : f.keys)
      if (k.name == leaf) out += (out.empty() ? "" : " or ") + ("model." + f.type + "." + leaf);
  return out;
}

void apply_mapping(Config& config, const YAML::Node& node, const std::string& section,
                   const Source& src, LayerState& layer) {
  if (node.IsNull()) return;  // "training:" with nothing under it
  if (!node.IsMap()) {
    throw ConfigError((section.empty() ? std::string("the config document") : section) +
                      " must be a mapping of keys to values, got " + describe(node) +
                      src.where(node));
  }
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const YAML::Node& k = kv.first;
    if (!k.IsScalar()) {
      throw ConfigError("config keys must be strings, got " + describe(k) + src.where(k));
    }
    const std::string path = section.empty() ? k.Scalar() : section + "." + k.Scalar();
    if (!seen.insert(k.Scalar()).second) {
      throw ConfigError("duplicate config key '" + path + "'" + src.where(k));
    }
    if (const Key* key = find_key(path)) {
      set_value(config, *key, kv.second, src, layer);
    } else if (is_section(path)) {
      // MACE's flat YAML has "model: MACE": a value where Crucible has a section.
      const std::string hint = kv.second.IsScalar() ? config_detail::mace_key_hint(path) : "";
      if (!hint.empty()) {
        throw ConfigError("config key '" + printable(path) + "'" + src.where(k) + " " + hint);
      }
      apply_mapping(config, kv.second, path, src, layer);
    } else if (const std::string hint = config_detail::mace_key_hint(path); !hint.empty()) {
      throw ConfigError("config key '" + printable(path) + "'" + src.where(k) + " " + hint);
    } else if (const std::string moved = moved_model_key(path); !moved.empty()) {
      throw ConfigError("config key '" + path + "'" + src.where(k) + " moved to " + moved +
                        " (each model's hyperparameters are model.<type>.*)");
    } else {
      const auto known = children(section);
      const std::string shown = printable(path);
      std::string msg = "unknown config key '" + shown + "'" + src.where(k) +
                        "; known keys: " + join(known, ", ");
      std::string best;
      size_t best_d = 4;
      for (const auto& c : known) {
        const std::string leaf = c.substr(c.rfind('.') + 1);
        if (k.Scalar().size() > 64) break;  // no suggestion for a long key (edit distance is quadratic)
        const size_t d = edit_distance(ascii_lower(k.Scalar()), ascii_lower(leaf));
        if (d < best_d) {
          best_d = d;
          best = c;
        }
      }
      if (!best.empty()) msg += " (did you mean '" + best + "'?)";
      throw ConfigError(msg);
    }
  }
}

void finish_layer(Config& config, const LayerState& layer) {
  const bool e = !layer.epochs_where.empty() && config.training.num_epochs;
  const bool s = !layer.steps_where.empty() && config.training.num_steps;
  if (e && s) {
    throw ConfigError(
        "training.num_epochs and training.num_steps must not both be set, got num_epochs" +
        layer.epochs_where + " and num_steps" + layer.steps_where + "; set only one");
  }
  if (e) config.training.num_steps.reset();
  if (s) config.training.num_epochs.reset();
}

std::string value_text(const Key& key, const Config& config) {
  void* p = key.ref(const_cast<Config&>(config));
  switch (key.kind) {
    case Kind::kString:
      return quote(as<std::string>(p));
    case Kind::kOptString: {
      const auto& v = as<std::optional<std::string>>(p);
      return v ? quote(*v) : "null";
    }
    case Kind::kInt:
      return std::to_string(as<int64_t>(p));
    case Kind::kOptInt: {
      const auto& v = as<std::optional<int64_t>>(p);
      return v ? std::to_string(*v) : "null";
    }
    case Kind::kFloat:
      return format_number(as<double>(p));
    case Kind::kBool:
      return as<bool>(p) ? "true" : "false";
    case Kind::kUnit: {
      const auto& u = as<UnitSetting>(p);
      return u.name.empty() ? format_number(u.factor) : quote(u.name);
    }
    case Kind::kIntList: {
      std::string out;
      for (int64_t v : as<std::vector<int64_t>>(p)) out += (out.empty() ? "" : ", ") + std::to_string(v);
      return "[" + out + "]";
    }
    case Kind::kE0s: {
      const auto& e = as<E0Setting>(p);
      if (e.mode == "file") return quote(e.file);
      if (e.mode != "map") return e.mode;
      std::string out;
      for (const auto& [name, v] : e.values) out += (out.empty() ? "" : ", ") + name + ": " + format_number(v);
      return "{" + out + "}";
    }
    case Kind::kWeightMap: {
      std::string out;
      for (const auto& [name, w] : as<std::map<std::string, double>>(p)) {
        out += (out.empty() ? "" : ", ") + quote(name) + ": " + format_number(w);
      }
      return "{" + out + "}";
    }
  }
  return "";
}

std::string type_name(const Key& key) {
  switch (key.kind) {
    case Kind::kString:
      return key.choices.empty() ? "string" : "string (" + join(key.choices, " | ") + ")";
    case Kind::kOptString:
      return "string or null";
    case Kind::kInt:
      return "integer";
    case Kind::kOptInt:
      return "integer or null";
    case Kind::kFloat:
      return "number";
    case Kind::kBool:
      return "boolean";
    case Kind::kUnit:
      return "unit name or number";
    case Kind::kWeightMap:
      return "mapping of name to number";
    case Kind::kE0s:
      return "least_squares | isolated | zero | foundation | estimated | JSON file | mapping of element to eV";
    case Kind::kIntList:
      return "list of integers";
  }
  return "";
}

std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string word, line;
  while (in >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

Config default_config() { return Config{}; }

std::vector<ConfigKeyInfo> config_keys() {
  const Config d = default_config();
  std::vector<ConfigKeyInfo> out;
  for (const auto& key : schema()) {
    std::string type = type_name(key);
    const std::string range = describe_range(key);
    if (!range.empty()) type += ", " + range;
    out.push_back(ConfigKeyInfo{key.path, type, value_text(key, d), key.units, key.doc});
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> config_sections() {
  return {
      {"data", "Training and validation data: files, label keys and units."},
      {"model", "Model architecture and its hyperparameters."},
      {"training", "Training loop: duration, batching, seeds, precision, device."},
      {"training.optimizer", "Optimizer (PyTorch Adam / AdamW semantics)."},
      {"training.scheduler", "Learning-rate schedule (per optimizer step)."},
      {"training.loss",
       "Loss = energy_weight · L_E + forces_weight · L_F + stress_weight · L_S, each term an "
       "MSE, MAE or Huber penalty."},
      {"output", "Where the run is written."},
  };
}

namespace {

/// Flow collections ([...], {...}) nested deeper than kMaxSpecDepth are
/// refused before yaml-cpp parses them recursively. Quotes and comments are
/// skipped roughly (a quote inside a plain scalar may end the scan early,
/// which only makes the check looser; yaml-cpp's own guard stays behind it).
void check_flow_nesting(const std::string& text, const std::string& source) {
  int depth = 0;
  int64_t line = 1;
  char quote_char = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      comment = false;
      continue;
    }
    if (comment) continue;
    if (quote_char) {
      if (c == quote_char) quote_char = 0;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote_char = c;
    } else if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) {
      comment = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxSpecDepth) {
        throw ConfigError(source + ":" + std::to_string(line) + ": config must nest at most " +
                          std::to_string(kMaxSpecDepth) + " levels of [ ] and { }, got deeper");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace

void apply_config_yaml(Config& config, const std::string& yaml_text, const std::string& source) {
  if (yaml_text.size() > kMaxConfigBytes) {
    throw ConfigError(source + ": config must be at most " + std::to_string(kMaxConfigBytes) +
                      " bytes, got " + std::to_string(yaml_text.size()));
  }
  check_flow_nesting(yaml_text, source);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": invalid YAML: " + e.msg);
  }
  Config updated = config;
  LayerState layer;
  Source src{source, false};
  try {
    apply_mapping(updated, root, "", src, layer);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  finish_layer(updated, layer);
  config = std::move(updated);
}

std::string read_config_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(what + " '" + path + "' cannot be opened (does it exist?)");
  // Read at most one byte past the limit: a huge file is never loaded whole.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError(what + " '" + path + "' must be at most " + std::to_string(kMaxConfigBytes) +
                      " bytes, got more");
  }
  if (in.bad()) throw ConfigError(what + " '" + path + "' cannot be read (I/O error)");
  return text;
}

std::string model_type_recipe(const std::string& model_type) {
  return model_type == "mace" ? config_detail::mace_recipe_yaml() : "";
}

namespace {

/// default_config() with `model_type`'s recipe applied (the defaults of a
/// run of that type); parsed once per type.
const Config& model_type_defaults(const std::string& model_type) {
  static const Config plain = default_config();
  static const Config mace = [] {
    Config c = default_config();
    apply_config_yaml(c, model_type_recipe("mace"), "the model.type mace recipe");
    return c;
  }();
  return model_type == "mace" ? mace : plain;
}

}  // namespace

Config load_run_config(const std::string& config_file, const std::vector<std::string>& overrides) {
  const std::string text = config_file.empty() ? "" : read_config_text(config_file, "config file");
  return load_run_config_text(text, config_file, overrides);
}

Config load_run_config_text(const std::string& yaml_text, const std::string& source,
                            const std::vector<std::string>& overrides) {
  auto layered = [&](const std::string& model_type) {
    Config c = model_type_defaults(model_type);
    if (!yaml_text.empty()) apply_config_yaml(c, yaml_text, source);
    apply_overrides(c, overrides);
    return c;
  };
  Config plain = layered("");
  // The user's layers name the model type; its recipe goes under them.
  return model_type_recipe(plain.model.type).empty() ? plain : layered(plain.model.type);
}

Config load_config_file(const std::string& path) {
  Config config = default_config();
  apply_config_yaml(config, read_config_text(path, "config file"), path);
  return config;
}

void apply_overrides(Config& config, const std::vector<std::string>& assignments) {
  Config updated = config;
  LayerState layer;
  for (const auto& a : assignments) {
    const std::string name = "command-line override '" + a + "'";
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("command-line override must be key.path=value (e.g. "
                        "training.num_epochs=3), got '" + a + "'");
    }
    const std::string path = a.substr(0, eq);
    const std::string value = a.substr(eq + 1);
    static const std::regex path_re("[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*");
    if (!std::regex_match(path, path_re)) {
      throw ConfigError("command-line override key must be a dotted path like "
                        "training.optimizer.lr, got '" + path + "'");
    }
    YAML::Node v;
    try {
      v = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      throw ConfigError(name + ": value is not valid YAML: " + e.msg);
    }
    // Nest the value under its path and apply it like a file.
    std::vector<std::string> parts;
    std::stringstream ps(path);
    for (std::string part; std::getline(ps, part, '.');) parts.push_back(part);
    YAML::Node root = v;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      YAML::Node m(YAML::NodeType::Map);
      m[*it] = root;
      root = m;
    }
    Source src{name, true};
    apply_mapping(updated, root, "", src, layer);
  }
  finish_layer(updated, layer);
  config = std::move(updated);
}

namespace {

/// An option that only some kinds (optimizers, schedules) use, and whether
/// the config changed it from its default.
struct UsedOption {
  const char* key;
  bool changed;
  std::vector<std::string> by;
};

/// True when `v` differs from the built-in default and from the model
/// type's recipe value (either counts as keeping "its default").
template <class T>
bool differs(const T& v, const T& plain, const T& recipe) {
  return v != plain && v != recipe;
}

/// The first changed option that `kind` does not use, or null.
const UsedOption* first_foreign_option(const std::vector<UsedOption>& options,
                                       const std::string& kind) {
  for (const auto& u : options) {
    if (u.changed && std::find(u.by.begin(), u.by.end(), kind) == u.by.end()) return &u;
  }
  return nullptr;
}

}  // namespace

void validate_config(const Config& config) {
  // "Keep its default" means the default of this model type: its recipe's
  // value where it has one (a MACE run may switch the plateau schedule off
  // without resetting the plateau options the recipe set).
  const Config& base = model_type_defaults(config.model.type);
  for (const auto& key : schema()) {
    void* p = key.ref(const_cast<Config&>(config));
    std::string e;
    switch (key.kind) {
      case Kind::kInt:
        e = check_range(key, static_cast<double>(as<int64_t>(p)));
        break;
      case Kind::kOptInt:
        if (as<std::optional<int64_t>>(p)) {
          e = check_range(key, static_cast<double>(*as<std::optional<int64_t>>(p)));
        }
        break;
      case Kind::kFloat: {
        const double v = as<double>(p);
        e = std::isfinite(v) ? check_range(key, v)
                             : key.path + " must be a finite number, got " + display_number(v);
        break;
      }
      case Kind::kString:
        e = check_choice(key, as<std::string>(p));
        break;
      case Kind::kOptString:
        if (as<std::optional<std::string>>(p)) {
          e = check_choice(key, *as<std::optional<std::string>>(p));
        }
        break;
      case Kind::kUnit: {
        const auto& u = as<UnitSetting>(p);
        if (!(u.factor > 0.0) || !std::isfinite(u.factor)) {
          e = key.path + " must be a finite number > 0, got " + display_number(u.factor);
        }
        break;
      }
      case Kind::kIntList:
        for (int64_t v : as<std::vector<int64_t>>(p)) {
          if (e.empty()) e = check_range(key, static_cast<double>(v));
        }
        break;
      default:
        break;
    }
    if (!e.empty()) throw ConfigError(e);
  }
  // Keys of another architecture than model.type must keep their defaults.
  {
    const ModelParams defaults = default_model_params();
    for (const auto& [id, value] : config.model.params) {
      const std::string owner = id.substr(0, id.find('.'));
      if (owner == config.model.type) continue;
      auto it = defaults.find(id);
      if (it == defaults.end()) throw ConfigError("unknown config key 'model." + id + "'");
      if (!(it->second == value)) {
        throw ConfigError("model." + id + " applies to model.type " + owner + ", but model.type is " +
                          config.model.type + "; remove it or set model.type: " + owner);
      }
    }
  }
  const auto& t = config.training;
  if (t.num_epochs.has_value() == t.num_steps.has_value()) {
    throw ConfigError(std::string("exactly one of training.num_epochs or training.num_steps must "
                                  "be set, got ") +
                      (t.num_epochs ? "both" : "neither"));
  }
  if (t.spike_skipping.min_history > t.spike_skipping.window) {
    throw ConfigError("training.spike_skipping.min_history must be <= "
                      "training.spike_skipping.window (" +
                      std::to_string(t.spike_skipping.window) + "), got " +
                      std::to_string(t.spike_skipping.min_history));
  }
  if (t.loss.energy_weight <= 0 && t.loss.forces_weight <= 0 && t.loss.stress_weight <= 0) {
    throw ConfigError(
        "training.loss must have at least one weight > 0 (energy_weight, forces_weight, "
        "stress_weight), got all 0");
  }
  if (t.validate_with_mixed_precision == "always" &&
      !(t.precision && (*t.precision == "bf16-mixed" || *t.precision == "16-mixed"))) {
    throw ConfigError("training.validate_with_mixed_precision = always needs training.precision "
                      "bf16-mixed or 16-mixed, got " +
                      (t.precision ? "'" + *t.precision + "'" : std::string("null")));
  }
  {
    const LossSettings& d = base.training.loss;
    const auto& l = t.loss;
    if (l.kind != "huber" && l.huber_delta != d.huber_delta) {
      throw ConfigError("training.loss.huber_delta is used only with training.loss.kind = huber; "
                        "it must keep its default with kind = " + l.kind);
    }
    if (l.schedule == "constant") {
      for (const auto& [key, changed] :
           std::vector<std::pair<std::string, bool>>{
               {"schedule_clock", l.schedule_clock != d.schedule_clock},
               {"schedule_start", l.schedule_start != d.schedule_start},
               {"schedule_end", l.schedule_end != d.schedule_end},
               {"energy_weight_final", l.energy_weight_final != d.energy_weight_final},
               {"forces_weight_final", l.forces_weight_final != d.forces_weight_final},
               {"stress_weight_final", l.stress_weight_final != d.stress_weight_final}}) {
        if (changed) {
          throw ConfigError("training.loss." + key + " is used only by a weight schedule; set "
                            "training.loss.schedule to linear, cosine or step, or keep its "
                            "default");
        }
      }
    } else if (l.schedule != "step" && l.schedule_end < l.schedule_start) {
      throw ConfigError("training.loss.schedule_end must be >= training.loss.schedule_start (" +
                        std::to_string(l.schedule_start) + "), got " +
                        std::to_string(l.schedule_end));
    }
  }
  {
    // Stage two (MACE's SWA stage) owns the loss weights from its epoch on.
    const StageTwoSettings& d = base.training.stage_two;
    const auto& st = t.stage_two;
    if (!st.enabled) {
      for (const auto& [key, changed] : std::vector<std::pair<std::string, bool>>{
               {"start_epoch", st.start_epoch != d.start_epoch},
               {"lr", st.lr != d.lr},
               {"energy_weight", st.energy_weight != d.energy_weight},
               {"forces_weight", st.forces_weight != d.forces_weight},
               {"stress_weight", st.stress_weight != d.stress_weight}}) {
        if (changed) {
          throw ConfigError("training.stage_two." + key + " is used only by stage two; set "
                            "training.stage_two.enabled=true, or keep its default");
        }
      }
    } else {
      if (t.loss.schedule != "constant") {
        throw ConfigError("training.stage_two sets the loss weights from its start epoch, so "
                          "training.loss.schedule must be constant, got '" + t.loss.schedule +
                          "'; use one of the two");
      }
      if (st.start_epoch && t.num_epochs && *st.start_epoch >= *t.num_epochs) {
        throw ConfigError("training.stage_two.start_epoch must be < training.num_epochs (" +
                          std::to_string(*t.num_epochs) + "), got " +
                          std::to_string(*st.start_epoch) + "; stage two would never start");
      }
      if (st.energy_weight <= 0 && st.forces_weight <= 0 && st.stress_weight <= 0) {
        throw ConfigError("training.stage_two must have at least one weight > 0 "
                          "(energy_weight, forces_weight, stress_weight), got all 0");
      }
    }
    if (config.model.init_from) {
      const ModelConfig& md = base.model;
      for (const auto& [key, changed] : std::vector<std::pair<std::string, bool>>{
               {"scaling", config.model.scaling != md.scaling},
               {"shift", config.model.shift != md.shift}}) {
        if (changed) {
          throw ConfigError("model." + key + " must keep its default with model.init_from: "
                            "the source model's energy scale and shift are kept");
        }
      }
    }
  }
  {
    // Options an optimizer does not have must keep their defaults.
    const OptimizerSettings& d = base.training.optimizer;
    const auto& o = t.optimizer;
    const std::vector<UsedOption> used = {
        {"beta1", differs(o.beta1, OptimizerSettings{}.beta1, d.beta1), {"adam", "adamw"}},
        {"beta2", differs(o.beta2, OptimizerSettings{}.beta2, d.beta2), {"adam", "adamw"}},
        {"amsgrad", differs(o.amsgrad, OptimizerSettings{}.amsgrad, d.amsgrad), {"adam", "adamw"}},
        {"eps", differs(o.eps, OptimizerSettings{}.eps, d.eps), {"adam", "adamw", "rmsprop", "adagrad"}},
        {"momentum", differs(o.momentum, OptimizerSettings{}.momentum, d.momentum), {"sgd", "rmsprop"}},
        {"dampening", differs(o.dampening, OptimizerSettings{}.dampening, d.dampening), {"sgd"}},
        {"nesterov", differs(o.nesterov, OptimizerSettings{}.nesterov, d.nesterov), {"sgd"}},
        {"alpha", differs(o.alpha, OptimizerSettings{}.alpha, d.alpha), {"rmsprop"}},
        {"centered", differs(o.centered, OptimizerSettings{}.centered, d.centered), {"rmsprop"}},
        {"lr_decay", differs(o.lr_decay, OptimizerSettings{}.lr_decay, d.lr_decay), {"adagrad"}},
        {"initial_accumulator_value", differs(o.initial_accumulator_value, OptimizerSettings{}.initial_accumulator_value, d.initial_accumulator_value),
         {"adagrad"}},
    };
    if (const UsedOption* u = first_foreign_option(used, o.name)) {
      throw ConfigError("training.optimizer." + std::string(u->key) + " is an option of " +
                        join(u->by, ", ") +
                        " only; it must keep its default with training.optimizer.name = " +
                        o.name);
    }
    if (!o.no_weight_decay.empty()) {
      try {
        std::regex check(o.no_weight_decay, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        throw ConfigError("training.optimizer.no_weight_decay must be a valid regular "
                          "expression, got '" + o.no_weight_decay + "' (" + e.what() + ")");
      }
    }
    // The strategy's own checks (e.g. the nesterov rule), named by key.
    check_optimizer_config(optimizer_config(t), "training.optimizer");
  }
  {
    // Options a schedule does not use must keep their defaults.
    const SchedulerSettings& d = base.training.scheduler;
    const auto& sc = t.scheduler;
    const std::vector<UsedOption> used = {
        {"final_lr_factor", differs(sc.final_lr_factor, SchedulerSettings{}.final_lr_factor, d.final_lr_factor), {"cosine"}},
        {"step_size", differs(sc.step_size, SchedulerSettings{}.step_size, d.step_size), {"step"}},
        {"gamma", differs(sc.gamma, SchedulerSettings{}.gamma, d.gamma), {"step", "exponential"}},
        {"warmup_steps", differs(sc.warmup_steps, SchedulerSettings{}.warmup_steps, d.warmup_steps),
         {"constant", "cosine", "step", "exponential"}},
        {"warmup_start_factor", differs(sc.warmup_start_factor, SchedulerSettings{}.warmup_start_factor, d.warmup_start_factor),
         {"constant", "cosine", "step", "exponential"}},
        {"monitor", differs(sc.monitor, SchedulerSettings{}.monitor, d.monitor), {"plateau"}},
        {"factor", differs(sc.factor, SchedulerSettings{}.factor, d.factor), {"plateau"}},
        {"patience", differs(sc.patience, SchedulerSettings{}.patience, d.patience), {"plateau"}},
        {"threshold", differs(sc.threshold, SchedulerSettings{}.threshold, d.threshold), {"plateau"}},
        {"cooldown", differs(sc.cooldown, SchedulerSettings{}.cooldown, d.cooldown), {"plateau"}},
        {"min_lr", differs(sc.min_lr, SchedulerSettings{}.min_lr, d.min_lr), {"plateau"}},
    };
    if (const UsedOption* u = first_foreign_option(used, sc.name)) {
      throw ConfigError("training.scheduler." + std::string(u->key) + " is used only by the " +
                        join(u->by, ", ") + " schedule" + (u->by.size() > 1 ? "s" : "") +
                        "; it must keep its default with training.scheduler.name = " + sc.name);
    }
  }
  static const std::regex device_re("cpu|cuda(:[0-9]+)?");
  if (!std::regex_match(t.device, device_re)) {
    throw ConfigError("training.device must be cpu, cuda or cuda:N, got '" + t.device + "'");
  }
  if (config.data.train_file.empty()) {
    throw ConfigError("data.train_file must be a file path, got an empty string");
  }
  if (config.data.valid_file && config.data.valid_file->empty()) {
    throw ConfigError("data.valid_file must be a file path or null, got an empty string");
  }
  if (config.output.run_dir && config.output.run_dir->empty()) {
    throw ConfigError("output.run_dir must be a directory path or null, got an empty string");
  }
}

std::string dump_config(const Config& config, bool comments) {
  std::ostringstream out;
  if (comments) {
    out << "# Crucible training configuration. Every key is listed with its default;\n"
           "# override any of them on the command line as key.path=value, e.g.\n"
           "#   crucible train --config this.yaml training.num_epochs=10 model.cutoff=4.5\n"
           "# Units: energies eV, forces eV/Å, stresses eV/Å^3, lengths Å (after the\n"
           "# data.*_unit conversions). See docs/config.md.\n\n";
  }
  std::string open_section;  // e.g. "training.optimizer"
  bool first = true;
  for (const auto& key : schema()) {
    const auto dot = key.path.rfind('.');
    const std::string section = key.path.substr(0, dot);
    const std::string leaf = key.path.substr(dot + 1);
    if (section != open_section) {
      // Open each section level not already open.
      std::vector<std::string> parts;
      std::stringstream ps(section);
      for (std::string part; std::getline(ps, part, '.');) parts.push_back(part);
      std::string prefix;
      for (size_t i = 0; i < parts.size(); ++i) {
        prefix += (i ? "." : "") + parts[i];
        const bool already =
            open_section == prefix || open_section.compare(0, prefix.size() + 1, prefix + ".") == 0;
        if (already) continue;
        const std::string indent(2 * i, ' ');
        if (i == 0 && !first) out << "\n";
        if (comments) {
          for (const auto& [name, doc] : config_sections()) {
            if (name != prefix) continue;
            for (const auto& line : wrap(doc, 76 - indent.size())) {
              out << indent << "# " << line << "\n";
            }
          }
        }
        out << indent << parts[i] << ":\n";
      }
      open_section = section;
    }
    first = false;
    const size_t depth = static_cast<size_t>(std::count(key.path.begin(), key.path.end(), '.'));
    const std::string indent(2 * depth, ' ');
    if (comments) {
      std::string doc = key.doc;
      if (!key.units.empty()) doc += " Unit: " + key.units + ".";
      const std::string range = describe_range(key);
      doc += " Type: " + type_name(key) + (range.empty() ? "" : ", " + range) + ".";
      for (const auto& line : wrap(doc, 76 - indent.size())) out << indent << "# " << line << "\n";
    }
    out << indent << leaf << ": " << value_text(key, config) << "\n";
  }
  return out.str();
}

std::string config_keys_markdown() {
  std::ostringstream out;
  out << "| key | type | default | units | meaning |\n";
  out << "| --- | --- | --- | --- | --- |\n";
  for (const auto& k : config_keys()) {
    std::string doc = k.doc;
    std::string t = k.type;
    for (auto* s : {&doc, &t}) {
      std::string r;
      for (char c : *s) r += (c == '|') ? std::string("\\|") : std::string(1, c);
      *s = r;
    }
    out << "| `" << k.path << "` | " << t << " | `" << k.default_value << "` | "
        << (k.units.empty() ? "—" : k.units) << " | " << doc << " |\n";
  }
  return out.str();
}

bool operator==(const Config& a, const Config& b) {
  for (const auto& key : schema()) {
    if (value_text(key, a) != value_text(key, b)) return false;
    if (key.kind == Kind::kUnit) {
      const auto& ua = as<UnitSetting>(key.ref(const_cast<Config&>(a)));
      const auto& ub = as<UnitSetting>(key.ref(const_cast<Config&>(b)));
      if (ua != ub) return false;
    }
  }
  return true;
}


SchedulerConfig scheduler_config(const SchedulerSettings& settings) {
  SchedulerConfig c;
  c.name = settings.name;
  c.final_lr_factor = settings.final_lr_factor;
  c.t_max = 0;
  c.step_size = settings.step_size;
  c.gamma = settings.gamma;
  c.warmup.steps = settings.warmup_steps;
  c.warmup.start_factor = settings.warmup_start_factor;
  c.plateau.monitor = settings.monitor;
  c.plateau.factor = settings.factor;
  c.plateau.patience = settings.patience;
  c.plateau.threshold = settings.threshold;
  c.plateau.cooldown = settings.cooldown;
  c.plateau.min_lr = settings.min_lr;
  return c;
}

OptimizerConfig optimizer_config(const TrainingConfig& training) {
  const auto& o = training.optimizer;
  OptimizerConfig c;
  c.name = o.name;
  c.lr = o.lr;
  c.weight_decay = o.weight_decay;
  if (o.name == "adam" || o.name == "adamw") {
    c.beta1 = o.beta1;
    c.beta2 = o.beta2;
    c.eps = o.eps;
    c.amsgrad = o.amsgrad;
  } else if (o.name == "sgd") {
    c.momentum = o.momentum;
    c.dampening = o.dampening;
    c.nesterov = o.nesterov;
  } else if (o.name == "rmsprop") {
    c.eps = o.eps;
    c.alpha = o.alpha;
    c.momentum = o.momentum;
    c.centered = o.centered;
  } else if (o.name == "adagrad") {
    c.eps = o.eps;
    c.lr_decay = o.lr_decay;
    c.initial_accumulator_value = o.initial_accumulator_value;
  }
  if (!o.no_weight_decay.empty()) {
    c.param_groups.push_back(ParamGroupConfig{o.no_weight_decay, {{"weight_decay", 0.0}}});
  }
  c.scheduler = scheduler_config(training.scheduler);
  return c;
}

namespace {

std::pair<double, double> loss_weights(const LossSettings& l, const std::string& name) {
  if (name == "energy") return {l.energy_weight, l.energy_weight_final};
  if (name == "forces") return {l.forces_weight, l.forces_weight_final};
  if (name == "stress") return {l.stress_weight, l.stress_weight_final};
  throw ConfigError("loss term must be energy, forces or stress, got '" + name + "'");
}

}  // namespace

std::shared_ptr<LossFunction> loss_term(const LossSettings& l, const std::string& name) {
  (void)loss_weights(l, name);  // checks the name
  const LossKind kind = parse_loss_kind(l.kind);
  const double delta = l.kind == "huber" ? l.huber_delta : 1.0;
  if (name == "energy") return std::make_shared<EnergyLoss>(kind, l.energy_per_atom, delta);
  if (name == "forces") {
    return std::make_shared<ForcesLoss>(kind, parse_forces_mode(l.forces_mode), delta);
  }
  return std::make_shared<StressLoss>(kind, delta);
}

std::shared_ptr<const LossWeightSchedule> loss_weight_schedule(const LossSettings& l,
                                                               const std::string& name) {
  const auto [w0, w1] = loss_weights(l, name);
  const ScheduleClock clock = parse_schedule_clock(l.schedule_clock);
  if (l.schedule == "linear") {
    return std::make_shared<LinearWeight>(w0, w1, l.schedule_start, l.schedule_end, clock);
  }
  if (l.schedule == "cosine") {
    return std::make_shared<CosineWeight>(w0, w1, l.schedule_start, l.schedule_end, clock);
  }
  if (l.schedule == "step") {
    return std::make_shared<PiecewiseConstantWeight>(std::vector<int64_t>{l.schedule_start},
                                                     std::vector<double>{w0, w1}, clock);
  }
  return std::make_shared<ConstantWeight>(w0, clock);
}

WeightedSumLoss loss_from_settings(const LossSettings& l) {
  WeightedSumLoss loss;
  for (const char* name : {"energy", "forces", "stress"}) {
    loss.add(loss_term(l, name), loss_weight_schedule(l, name));
  }
  loss.set_normalize_weights(l.normalize_weights);
  loss.set_config_type_weights(l.config_type_weights);
  return loss;
}

std::optional<int64_t> stage_two_start_epoch(const TrainingConfig& t,
                                             std::optional<int64_t> run_epochs) {
  if (!t.stage_two.enabled) return std::nullopt;
  if (t.stage_two.start_epoch) return *t.stage_two.start_epoch;
  const std::optional<int64_t> epochs = t.num_epochs ? t.num_epochs : run_epochs;
  if (!epochs) {
    throw ConfigError("training.stage_two.start_epoch: with training.num_steps, its default "
                      "needs the run's epoch count (set start_epoch, or give the data)");
  }
  return std::max<int64_t>(1, *epochs / 4 * 3);  // mace/tools/arg_parser_tools.py
}

LossSettings effective_loss_settings(const TrainingConfig& t, std::optional<int64_t> run_epochs) {
  LossSettings l = t.loss;
  const auto start = stage_two_start_epoch(t, run_epochs);
  if (!start) return l;
  l.schedule = "step";
  l.schedule_clock = "epoch";
  l.schedule_start = *start;
  l.energy_weight_final = t.stage_two.energy_weight;
  l.forces_weight_final = t.stage_two.forces_weight;
  l.stress_weight_final = t.stage_two.stress_weight;
  return l;
}

double max_loss_weight(const LossSettings& l, const std::string& name) {
  const auto [w0, w1] = loss_weights(l, name);
  return l.schedule == "constant" ? w0 : std::max(w0, w1);
}

std::vector<std::string> recipe_differences(const Config& saved, const Config& now) {
  static const std::vector<std::string> prefixes = {
      "data.",        "model.",          "training.batch_size", "training.seed",
      "training.dtype", "training.precision", "training.optimizer.name",
      "training.scheduler.name", "training.gradient_accumulation_steps", "training.device"};
  std::vector<std::string> out;
  for (const auto& key : schema()) {
    bool matters = false;
    for (const auto& p : prefixes) matters = matters || key.path.rfind(p, 0) == 0;
    if (!matters) continue;
    const std::string a = value_text(key, saved), b = value_text(key, now);
    if (a != b) out.push_back(key.path + ": " + a + " -> " + b);
  }
  return out;
}

namespace {

constexpr const char* kSpecFormat = "crucible-spec";
constexpr int kSpecVersion = 1;

nlohmann::ordered_json spec_value(const Key& key, const Config& config) {
  void* p = key.ref(const_cast<Config&>(config));
  switch (key.kind) {
    case Kind::kString:
      return as<std::string>(p);
    case Kind::kOptString: {
      const auto& v = as<std::optional<std::string>>(p);
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
    }
    case Kind::kInt:
      return as<int64_t>(p);
    case Kind::kOptInt: {
      const auto& v = as<std::optional<int64_t>>(p);
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
    }
    case Kind::kFloat:
      return as<double>(p);
    case Kind::kBool:
      return as<bool>(p);
    case Kind::kUnit: {
      const auto& u = as<UnitSetting>(p);
      return u.name.empty() ? nlohmann::ordered_json(u.factor) : nlohmann::ordered_json(u.name);
    }
    case Kind::kIntList:
      return as<std::vector<int64_t>>(p);
    case Kind::kE0s: {
      const auto& e = as<E0Setting>(p);
      if (e.mode == "file") return e.file;
      if (e.mode != "map") return e.mode;
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [name, v] : e.values) m[name] = v;
      return m;
    }
    case Kind::kWeightMap: {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [name, w] : as<std::map<std::string, double>>(p)) m[name] = w;
      return m;
    }
  }
  return nullptr;
}

}  // namespace

std::string config_to_spec_json(const Config& config) {
  nlohmann::ordered_json root;
  root["format"] = kSpecFormat;
  root["spec_version"] = kSpecVersion;
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  for (const auto& key : schema()) {
    nlohmann::ordered_json* node = &cfg;
    std::stringstream ps(key.path);
    std::vector<std::string> parts;
    for (std::string part; std::getline(ps, part, '.');) parts.push_back(part);
    for (size_t i = 0; i + 1 < parts.size(); ++i) node = &(*node)[parts[i]];
    (*node)[parts.back()] = spec_value(key, config);
  }
  root["config"] = cfg;
  return root.dump(2) + "\n";
}

Config config_from_spec_json(const std::string& text, const std::string& source) {
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError(source + ": spec must be at most " + std::to_string(kMaxConfigBytes) +
                      " bytes, got " + std::to_string(text.size()));
  }
  nlohmann::json root;
  try {
    // The callback sees every value with its depth: too deep stops the parse.
    root = nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxSpecDepth) {
        throw ConfigError(source + ": spec must nest at most " + std::to_string(kMaxSpecDepth) +
                          " levels of arrays and objects, got deeper");
      }
      return true;
    });
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(source + ": spec must be valid JSON, got a syntax error (" + e.what() + ")");
  } catch (const nlohmann::json::exception& e) {
    // e.g. a number out of double's range (out_of_range.406).
    throw ConfigError(source + ": spec must be valid JSON, got " + e.what());
  }
  if (!root.is_object()) throw ConfigError(source + ": spec must be a JSON object");
  for (const auto& [k, v] : root.items()) {
    (void)v;
    if (k != "format" && k != "spec_version" && k != "config") {
      throw ConfigError(source + ": unknown spec key '" + k +
                        "'; known keys: format, spec_version, config");
    }
  }
  if (!root.contains("format") || root["format"] != kSpecFormat) {
    throw ConfigError(source + ": spec format must be \"" + kSpecFormat + "\", got " +
                      (root.contains("format") ? root["format"].dump() : std::string("none")));
  }
  if (!root.contains("spec_version") || root["spec_version"] != kSpecVersion) {
    throw ConfigError(source + ": spec_version must be " + std::to_string(kSpecVersion) +
                      ", got " +
                      (root.contains("spec_version") ? root["spec_version"].dump()
                                                     : std::string("none")));
  }
  if (!root.contains("config") || !root["config"].is_object()) {
    throw ConfigError(source + ": spec key 'config' must be an object of config sections");
  }
  // JSON is YAML: the config goes through the YAML loader (key paths, types,
  // unknown keys), with lines counted in the original text.
  Config out = default_config();
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ": invalid spec: " + e.msg);
  }
  YAML::Node cfg = doc["config"];
  LayerState layer;
  Source src{source, false};
  apply_mapping(out, cfg, "", src, layer);
  finish_layer(out, layer);
  validate_config(out);
  return out;
}

}  // namespace crucible
