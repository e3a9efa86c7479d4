#pragma once
// The values of the model.<type>.* config keys (issue 16): each registered
// model declares its keys; the config layer stores their values here
// without knowing what they mean.

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace crucible {

/// One model hyperparameter: a boolean, an integer, a number, a string or a
/// list of integers (e.g. MACE's radial_mlp [64, 64, 64]).
using ModelParamValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>>;

/// Values by "<type>.<key>" ("schnet.hidden_channels", "mace.hidden_irreps").
using ModelParams = std::map<std::string, ModelParamValue>;

/// Every registered model's keys at their defaults. Never throws.
ModelParams default_model_params();

}  // namespace crucible
