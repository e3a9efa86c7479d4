// Where a run's input files are looked up (crucible/run/data_paths.h).

#include "crucible/run/data_paths.h"

#include "crucible/common/error.h"
#include "crucible/data/deepmd.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace crucible {

namespace fs = std::filesystem;

namespace {

/// `p` (which exists) must be a regular file. @throws DataError naming `key`.
void require_regular_file(const fs::path& p, const std::string& key, const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  const std::string what = key + " file '" + path + "'";
  if (ec) throw DataError(what + " cannot be read (" + ec.message() + ")");
  switch (st.type()) {
    case fs::file_type::regular: return;
    case fs::file_type::directory:
      if (is_deepmd_path(p.string())) return;  // a DeePMD system (issue 18)
      throw DataError(what + " is a directory without a DeePMD system (type.raw in it or up to 16 levels below); data files "
                      "are extended-XYZ files (.xyz, .extxyz) or DeePMD system directories");
    case fs::file_type::fifo:
      throw DataError(what + " is a FIFO (named pipe); data files must be regular files");
    case fs::file_type::character:
    case fs::file_type::block:
      throw DataError(what + " is a device; data files must be regular files");
    default:
      throw DataError(what + " is not a regular file (a socket or other special file)");
  }
}

/// True if `p` exists; a symlink loop or an unreadable path is a DataError
/// naming `key` (fs::exists would throw an internal filesystem_error).
bool data_path_exists(const fs::path& p, const std::string& key, const std::string& path) {
  std::error_code ec;
  const bool found = fs::exists(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw DataError(key + " file '" + path + "' cannot be read (" + ec.message() + ")");
  }
  return found;
}

}  // namespace

std::string resolve_data_path(const std::string& path, const std::string& key) {
  const fs::path p(path);
  std::vector<std::string> tried;
  if (data_path_exists(p, key, path)) {
    require_regular_file(p, key, path);
    return fs::absolute(p).lexically_normal().string();
  }
  tried.push_back(fs::absolute(p).lexically_normal().string());
#ifdef CRUCIBLE_DATA_DIR
  if (p.is_relative()) {
    auto it = p.begin();
    if (it != p.end() && it->string() == "data") {
      fs::path alt(CRUCIBLE_DATA_DIR);
      for (++it; it != p.end(); ++it) alt /= *it;
      if (data_path_exists(alt, key, path)) {
        require_regular_file(alt, key, path);
        return alt.lexically_normal().string();
      }
      tried.push_back(alt.lexically_normal().string());
    }
  }
#endif
  std::string where;
  for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
  throw DataError(key + " file '" + path + "' does not exist (looked in: " + where + ")");
}

std::string resolve_config_path(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return path;
  std::vector<std::string> tried{fs::absolute(p).lexically_normal().string()};
#ifdef CRUCIBLE_DATA_DIR
  if (p.is_relative()) {  // issue 47: configs/x.yaml falls back to the source tree, as data/ does
    auto it = p.begin();
    if (it != p.end() && it->string() == "configs") {
      fs::path alt = fs::path(CRUCIBLE_DATA_DIR).parent_path() / "configs";
      for (++it; it != p.end(); ++it) alt /= *it;
      if (fs::is_regular_file(alt, ec)) return alt.lexically_normal().string();
      tried.push_back(alt.lexically_normal().string());
    }
  }
#endif
  std::string where;
  for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
  throw ConfigError("--config file '" + path + "' does not exist or is not a file (looked in: " + where + ")");
}

}  // namespace crucible
