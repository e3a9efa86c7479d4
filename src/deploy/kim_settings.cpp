// See include/crucible/deploy/kim_settings.h.

#include "crucible/deploy/kim_settings.h"

#include "crucible/common/dtype_names.h"
#include "crucible/common/error.h"

#include <nlohmann/json.hpp>

#include <fstream>

namespace crucible {

at::ScalarType kim_dtype(const std::string& name, const std::string& what) {
  if (const auto t = dtype_from_name(name)) return *t;
  throw ConfigError(what + ": expected " + dtype_choices() + ", got '" + name + "'");
}

std::string kim_settings_json(const KimSettings& settings) {
  nlohmann::json j;
  j["dtype"] = dtype_name(settings.dtype);
  return j.dump(2) + "\n";
}

KimSettings read_kim_settings(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw DataError(path + ": cannot read the KIM model's settings");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw DataError(path + ": expected a JSON object such as {\"dtype\": \"float64\"}");
  KimSettings s;
  for (const auto& [key, value] : j.items()) {
    if (key != "dtype") throw DataError(path + ": unknown key '" + key + "' (known: dtype)");
    if (!value.is_string()) throw DataError(path + ": dtype must be \"float64\" or \"float32\"");
    try {
      s.dtype = kim_dtype(value.get<std::string>(), path + ": dtype");
    } catch (const ConfigError& e) {
      throw DataError(e.what());
    }
  }
  return s;
}

}  // namespace crucible
