// data.format dispatch. See include/crucible/data/formats.h.

#include "crucible/data/formats.h"

#include "crucible/common/error.h"
#include "crucible/data/ase_db.h"
#include "crucible/data/deepmd.h"

#include <filesystem>

namespace crucible {

namespace fs = std::filesystem;

std::string detect_format(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (is_deepmd_path(path)) return "deepmd";
    throw DataError(path + ": is a directory without a DeePMD system (type.raw in it or below); data files are "
                           "extended-XYZ files (.xyz, .extxyz) or DeePMD system directories");
  }
  const std::string ext = p.extension().string();
  if (ext == ".npy" || p.filename() == "type.raw" || p.filename() == "type_map.raw") {
    throw DataError(path + ": is a file of a DeePMD system; give the system directory (the one holding type.raw), " +
                    (p.parent_path().filename().string().rfind("set.", 0) == 0 ? p.parent_path().parent_path().string()
                                                                                 : p.parent_path().string()));
  }
  if (ext == ".db" || is_sqlite_file(path)) return "ase_db";
  return "extxyz";
}

std::vector<Structure> read_structures(const std::string& path, const std::string& format,
                                       const ExtxyzOptions& options) {
  const std::string f = format == "auto" ? detect_format(path) : format;
  if (f == "deepmd") return read_deepmd(path, options);
  if (f == "extxyz") return read_extxyz(path, options);
  if (f == "ase_db") return read_ase_db(path, options);
  throw DataError(path + ": data.format must be auto, extxyz, deepmd or ase_db, got '" + format + "'");
}

void write_structures(const std::string& path, const std::string& format, const std::vector<Structure>& structures) {
  std::string f = format;
  if (f == "auto") {
    const std::string ext = fs::path(path).extension().string();
    f = ext == ".xyz" || ext == ".extxyz" ? "extxyz" : ext == ".db" ? "ase_db" : "deepmd";
  }
  if (f == "deepmd") return write_deepmd(path, structures);
  if (f == "extxyz") return write_extxyz(path, structures);
  if (f == "ase_db") return write_ase_db(path, structures);
  throw DataError(path + ": the output format must be extxyz, deepmd or ase_db, got '" + format + "'");
}

}  // namespace crucible
