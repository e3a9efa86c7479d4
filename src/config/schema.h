#pragma once
// The recipe's key table (internal to src/config/): each section's keys are
// declared in src/config/keys/<section>.cpp beside their defaults' owner;
// config.cpp loads, validates, dumps and documents them from this table.

#include "crucible/config/config.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace crucible::config_schema {

/// What a key holds (how YAML text becomes its value).
enum class Kind { kString, kOptString, kInt, kOptInt, kFloat, kBool, kUnit, kWeightMap, kIntList, kE0s };

/// One recipe key: its dotted path, kind, physical unit, documentation,
/// where its value lives in a Config, and its range or choices.
struct Key {
  std::string path;
  Kind kind = Kind::kString;
  std::string units;  // physical unit of the value ("" = none)
  std::string doc;
  std::function<void*(Config&)> ref;
  // Range / choice constraints (checked on set and in validate_config).
  std::optional<double> min;  // inclusive unless min_exclusive
  bool min_exclusive = false;
  std::optional<double> max;  // exclusive unless max_inclusive
  bool max_inclusive = false;
  std::vector<std::string> choices;
  UnitQuantity unit_quantity = UnitQuantity::kEnergy;
};

/// The keys in the order `crucible config` and config.yaml list them.
class KeyTable {
 public:
  /// Appends a key; the reference stays valid until the next add.
  Key& add(std::string path, Kind kind, std::string units, std::string doc,
           std::function<void*(Config&)> ref) {
    Key key;
    key.path = std::move(path);
    key.kind = kind;
    key.units = std::move(units);
    key.doc = std::move(doc);
    key.ref = std::move(ref);
    keys.push_back(std::move(key));
    return keys.back();
  }
  std::vector<Key> keys;
};

/// `key` takes values >= v.
inline void min_incl(Key& key, double v) { key.min = v; }
/// `key` takes values > v.
inline void min_excl(Key& key, double v) {
  key.min = v;
  key.min_exclusive = true;
}

// One function per section (src/config/keys/), called in this order.
void add_data_keys(KeyTable& t);           ///< data.*: files, label keys, units, E0s.
void add_model_keys(KeyTable& t);          ///< model.type, cutoff, scaling; each model type's keys.
void add_training_loop_keys(KeyTable& t);  ///< training.num_epochs ... seed.
void add_optimizer_keys(KeyTable& t);      ///< training.optimizer.*, training.scheduler.*.
void add_update_keys(KeyTable& t);         ///< clipping, freezing, accumulation, spike skipping, data parallel, replay, EMA, stage two, early stopping.
void add_loss_keys(KeyTable& t);           ///< training.loss.*.
void add_training_run_keys(KeyTable& t);   ///< validation cadence, dtype, precision, device, threads.
void add_output_keys(KeyTable& t);         ///< output.*.

}  // namespace crucible::config_schema
