// `crucible export kim`: a trained model as KIM items for LAMMPS (issue 17,
// deliverable 2). Layout and reasons: docs/deployment_kim.md.

#include "crucible/cli/commands.h"
#include "crucible/deploy/kim_settings.h"
#include "crucible/run/model_io.h"
#include "crucible/common/error.h"
#include "crucible/common/fs_error.h"
#include "crucible/data/extxyz.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#ifndef CRUCIBLE_KIM_ENGINE
#define CRUCIBLE_KIM_ENGINE ""
#endif

namespace crucible {

namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f.flush()) throw DataError(path.string() + ": cannot write the file");
}

/// The driver item (top level; it builds the model item in model/ too).
/// The top-level item is the driver so that kim-api-collections-management
/// installs both without looking for the driver on openkim.org.
std::string driver_cmake(const std::string& name) {
  return fmt::format(R"(# KIM model driver {name}_driver and portable model {name}, written by
# `crucible export kim`. Install with:
#   kim-api-collections-management install user THIS_DIRECTORY
cmake_minimum_required(VERSION 3.10)
list(APPEND CMAKE_PREFIX_PATH $ENV{{KIM_API_CMAKE_PREFIX_DIR}})
find_package(KIM-API-ITEMS 2.2 REQUIRED CONFIG)
kim_api_items_setup_before_project(ITEM_TYPE "modelDriver")
project({name}_driver)
kim_api_items_setup_after_project(ITEM_TYPE "modelDriver")

# The driver's create routine is in libcrucible_kim.so (Crucible's KIM
# driver, src/deploy/kim/), installed next to the driver.
add_kim_api_model_driver_library(
  NAME {name}_driver
  CREATE_ROUTINE_NAME crucible_kim_model_driver_create
  CREATE_ROUTINE_LANGUAGE cpp)
target_link_libraries({name}_driver PRIVATE ${{CMAKE_CURRENT_SOURCE_DIR}}/libcrucible_kim.so)
set_target_properties({name}_driver PROPERTIES
  BUILD_RPATH ${{CMAKE_CURRENT_SOURCE_DIR}} INSTALL_RPATH "$ORIGIN")

# The collection directory the driver goes to (as kim-api-items-macros.cmake
# determines it), for libcrucible_kim.so.
if(KIM_API_INSTALL_COLLECTION STREQUAL "SYSTEM")
  set(_collection system)
elseif(KIM_API_INSTALL_COLLECTION STREQUAL "ENVIRONMENT")
  set(_collection env)
else()
  set(_collection config_file)
endif()
string(TOUPPER "${{CMAKE_BUILD_TYPE}}" _build_type)
if(_build_type STREQUAL "")
  set(_build_type NOCONFIG)
endif()
get_property(_collections_info TARGET KIM-API::collections-info PROPERTY "IMPORTED_LOCATION_${{_build_type}}")
execute_process(COMMAND ${{_collections_info}} ${{_collection}} model_drivers
  OUTPUT_VARIABLE _drivers_dir OUTPUT_STRIP_TRAILING_WHITESPACE)
string(REGEX REPLACE "\n.*" "" _drivers_dir "${{_drivers_dir}}")
if(DEFINED KIM_API_MODEL_DRIVER_INSTALL_PREFIX)
  set(_drivers_dir "${{KIM_API_MODEL_DRIVER_INSTALL_PREFIX}}")
endif()
install(FILES libcrucible_kim.so DESTINATION "${{_drivers_dir}}/{name}_driver")

add_subdirectory(model)
)",
                     fmt::arg("name", name));
}

std::string model_cmake(const std::string& name) {
  return fmt::format(R"(# KIM portable model {name} (driver {name}_driver), written by `crucible export kim`.
kim_api_items_setup_before_project(ITEM_TYPE "portableModel")
kim_api_items_setup_after_project(ITEM_TYPE "portableModel")
add_kim_api_model_library(
  NAME {name}
  DRIVER_NAME {name}_driver
  PARAMETER_FILES model.json model.pt settings.json)
)",
                     fmt::arg("name", name));
}

std::string readme(const std::string& name, const LoadedModel& loaded, const std::string& source,
                   const std::string& elements, const std::string& dtype) {
  return fmt::format(R"(# KIM portable model {name}

Exported by `crucible export kim` from {source}: a {type} model of {elements}
(cutoff {cutoff} Å, interaction range {range} Å), metal units (Å, eV),
evaluated in {dtype} (settings.json; `crucible export kim --dtype`).

Install (builds the driver {name}_driver and the model {name}):

    kim-api-collections-management install user {name_dir}

LAMMPS input:

    kim init {name} metal
    read_data structure.data
    kim interactions {elements}

Energy, forces, per-atom energy (compute pe/atom), the virial (pressure)
and the per-atom virial (compute stress/atom) come from the model; an
element it was not trained on fails at `kim interactions`.
)",
                     fmt::arg("name", name), fmt::arg("source", source), fmt::arg("type", loaded.meta.model_type),
                     fmt::arg("elements", elements), fmt::arg("cutoff", loaded.model->cutoff()),
                     fmt::arg("range", loaded.model->interaction_range()), fmt::arg("name_dir", "THIS_DIRECTORY"),
                     fmt::arg("dtype", dtype));
}

}  // namespace

std::string kim_engine_path() { return CRUCIBLE_KIM_ENGINE; }

void run_export_kim(const ExportKimRequest& request, std::ostream& out) {
  static const std::regex identifier("[A-Za-z_][A-Za-z0-9_]*");
  if (!std::regex_match(request.name, identifier)) {
    throw ConfigError("--name must be a KIM item name (letters, digits and _, not starting with a digit), got '" +
                      request.name + "'");
  }
  KimSettings settings;
  settings.dtype = kim_dtype(request.dtype, "--dtype");
  const std::string engine = kim_engine_path();
  if (engine.empty() || !fs::is_regular_file(engine)) {
    throw ConfigError("export kim needs Crucible's KIM driver (libcrucible_kim.so), which this build lacks" +
                      (engine.empty() ? std::string(": libkim-api-dev was not found when configuring")
                                      : ": " + engine + " is missing; build the crucible_kim target"));
  }
  const std::string model_dir = model_directory(request.run_dir);
  const LoadedModel loaded = load_model(request.run_dir);  // refuses bad or unknown-format models
  // The weights exported: the .pt file given (model_last.pt), else the run's model.pt.
  const fs::path weights = fs::is_regular_file(request.run_dir) ? fs::path(request.run_dir)
                                                                : fs::path(model_dir) / "model.pt";
  const std::string elements = element_symbols(loaded.meta.atomic_numbers);
  if (request.out_dir.empty()) throw DataError("export kim --out must name a new or empty directory, got ''");
  const fs::path dest(request.out_dir);
  if (fs::exists(dest) && !(fs::is_directory(dest) && fs::is_empty(dest))) {
    throw DataError(dest.string() + ": --out must be a new or empty directory (nothing is overwritten)");
  }
  // Everything goes to a temporary sibling first, renamed at the end.
  const fs::path parent = fs::absolute(dest).parent_path();
  if (!fs::is_directory(parent)) throw DataError(parent.string() + ": the parent of --out must be a directory");
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", dest.filename().string(), std::random_device{}());
  try {
    fs::create_directories(tmp / "model");
    fs::copy_file(engine, tmp / "libcrucible_kim.so");
    fs::copy_file(fs::path(model_dir) / "model.json", tmp / "model" / "model.json");
    fs::copy_file(weights, tmp / "model" / "model.pt");
    write_text(tmp / "model" / kKimSettingsFile, kim_settings_json(settings));
    write_text(tmp / "CMakeLists.txt", driver_cmake(request.name));
    write_text(tmp / "model" / "CMakeLists.txt", model_cmake(request.name));
    write_text(tmp / "README.md", readme(request.name, loaded, model_dir, elements, request.dtype));
    if (fs::exists(dest)) fs::remove(dest);  // empty, checked above
    fs::rename(tmp, dest);
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw DataError("export kim: " + filesystem_error_text(e) + " (nothing was written)");
  }
  out << fmt::format("wrote KIM model {} (driver {}_driver, {}) to {}\n", request.name, request.name, request.dtype,
                     dest.string());
  out << fmt::format("install: kim-api-collections-management install user {}\n", dest.string());
  out << fmt::format("LAMMPS:  kim init {} metal ... kim interactions {}\n", request.name, elements);
}

}  // namespace crucible
