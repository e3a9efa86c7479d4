#pragma once
// The evaluation settings of an exported KIM model (issue 19): the
// parameter file settings.json that `crucible export kim` writes beside
// model.json and model.pt, read by the KIM model driver at create.

#include <c10/core/ScalarType.h>

#include <string>

namespace crucible {

/// Basename of the settings parameter file.
inline constexpr const char* kKimSettingsFile = "settings.json";

/// What the driver needs beyond the model itself.
struct KimSettings {
  /// The dtype the model evaluates in: at::kDouble (default; positions and
  /// results are float64 either way, as KIM passes them) or at::kFloat.
  at::ScalarType dtype = at::kDouble;
};

/// "float64" / "float32" → at::kDouble / at::kFloat.
/// @throws ConfigError naming `what` (e.g. "--dtype") for anything else.
at::ScalarType kim_dtype(const std::string& name, const std::string& what);

/// The settings as the JSON text of settings.json: {"dtype": "float32"}.
std::string kim_settings_json(const KimSettings& settings);

/// Reads settings.json at `path`. Every key must be known ("dtype").
/// @throws DataError naming the file for unreadable JSON, an unknown key
///         or a dtype other than "float64" / "float32".
KimSettings read_kim_settings(const std::string& path);

}  // namespace crucible
