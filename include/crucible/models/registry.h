#pragma once
// The model registry (issue 16): `model.type` picks an architecture; each
// model declares its config keys (model.<type>.*), its factory, what
// model.json records about it and its parameter estimate, in its own folder
// under src/models/. Adding a model is one folder and one line in
// src/models/builtin_models.cpp.

#include "crucible/models/energy_model.h"
#include "crucible/models/model_params.h"
#include "crucible/training/memory_estimate.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// One model.<type>.<name> config key.
struct ModelKey {
  std::string name;         ///< "hidden_channels" (the key is model.<type>.<name>).
  ModelParamValue default_value;  ///< its type is the key's type.
  std::string doc;          ///< one or two sentences for docs/config.md.
  std::string units;        ///< physical unit, "" = none.
  std::optional<double> min;      ///< inclusive lower bound (numbers, list entries).
  bool min_exclusive = false;
  std::vector<std::string> choices;  ///< allowed strings, empty = any.
};

/// What a factory gets to build a model for a run.
struct ModelBuildContext {
  std::string type;                 ///< model.type.
  const ModelParams* params = nullptr;  ///< every model.<type>.* value.
  double cutoff = 5.0;              ///< model.cutoff, Å.
  std::vector<int64_t> elements;    ///< atomic numbers of the training set, ascending.
  double avg_num_neighbors = 1.0;   ///< mean neighbors per atom within cutoff (training set).

  /// The value of model.<type>.<name>. @throws std::invalid_argument naming
  /// the key if it is missing or of another type.
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  std::string get_string(const std::string& name) const;
  std::vector<int64_t> get_int_list(const std::string& name) const;
};

/// A registered architecture.
struct ModelFactory {
  std::string type;         ///< "schnet", "mace".
  std::string description;  ///< one line: paper and what it is.
  std::vector<ModelKey> keys;
  /// A new model (float32, seeded by the caller's generator, no energy
  /// normalization yet). @throws std::invalid_argument for bad values.
  std::function<std::shared_ptr<EnergyModel>(const ModelBuildContext&)> create;
  /// model.json "hyperparameters": everything from_json needs.
  std::function<nlohmann::json(const EnergyModel&)> to_json;
  /// The model of to_json's object (float32, untrained).
  /// @throws std::invalid_argument / nlohmann::json::exception on bad input.
  std::function<std::shared_ptr<EnergyModel>(const nlohmann::json&)> from_json;
  /// Parameter count before building (issue 15's memory limit).
  std::function<double(const ModelBuildContext&)> parameter_estimate;
  /// Numbers a training batch holds per edge and per atom at its peak
  /// (issue 47; crucible/training/memory_estimate.h), calibrated against
  /// measured peaks; unset = not estimated.
  std::function<ActivationEstimate(const ModelBuildContext&)> activation_estimate;
};

/// Every registered model, in registration order. Never throws.
const std::vector<ModelFactory>& model_registry();

/// The factory of `type`. @throws std::invalid_argument "model.type must be
/// one of schnet, mace, got '...'".
const ModelFactory& model_factory(const std::string& type);

/// The built-in models (src/models/builtin_models.cpp): one line per model.
std::vector<ModelFactory> builtin_models();

}  // namespace crucible
