#pragma once
// MACE's vocabulary in Crucible's config (issue 46): the recipe that
// model.type = mace brings, and MACE's argument names mapped to Crucible's
// keys. Internal to src/config/; the public entry points are in
// crucible/config/config.h (model_type_recipe, load_run_config).

#include <string>

namespace crucible::config_detail {

/// YAML text of MACE's training recipe (mace v0.3 run_train defaults where
/// they differ from Crucible's), applied over the built-in defaults when
/// model.type is mace. Source: mace/tools/arg_parser.py,
/// arg_parser_tools.py, model_script_utils.py, train.py.
const char* mace_recipe_yaml();

/// For a key a MACE user writes (the last component of `path`, e.g.
/// "r_max", "max_L", "swa_lr", or MACE's flat YAML keys at the top level):
/// "is MACE's --<name>; in Crucible <what to set>"; "" when the name is
/// not one of MACE's. Never throws.
std::string mace_key_hint(const std::string& path);

}  // namespace crucible::config_detail
