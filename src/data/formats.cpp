// data.format dispatch. See include/crucible/data/formats.h.

#include "crucible/data/formats.h"

#include "crucible/common/error.h"
#include "crucible/data/ase_db.h"
#include "crucible/data/deepmd.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>

namespace crucible {

namespace fs = std::filesystem;

std::string detect_format(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (is_deepmd_path(path)) return "deepmd";
    throw DataError(path + ": is a directory without a DeePMD system (type.raw in it or up to 16 levels below); data files are "
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

namespace {

/// A name in `path`'s folder that no one else uses: .<name>.crucible-<pid>-<random>.tmp.
fs::path owned_temp_path(const fs::path& path) {
  std::random_device rd;
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    char tail[64];
    std::snprintf(tail, sizeof tail, ".crucible-%ld-%016llx.tmp", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(r));
    const fs::path candidate = dir / ("." + path.filename().string() + tail);
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(candidate, ec))) return candidate;
  }
  throw DataError(path.string() + ": no free temporary name beside it");
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

}  // namespace

void write_structures(const std::string& path, const std::string& format, const std::vector<Structure>& structures,
                      bool overwrite) {
  std::string f = format;
  if (f == "auto") {
    const std::string ext = fs::path(path).extension().string();
    f = ext == ".xyz" || ext == ".extxyz" ? "extxyz" : ext == ".db" ? "ase_db" : "deepmd";
  }
  if (f != "deepmd" && f != "extxyz" && f != "ase_db") {
    throw DataError(path + ": the output format must be extxyz, deepmd or ase_db, got '" + format + "'");
  }
  if (path.empty()) throw DataError("the output path must not be empty");
  const fs::path out(path);
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(out, ec);
  const bool exists = fs::exists(status);
  if (exists) {
    const bool empty_dir = fs::is_directory(status) && fs::is_empty(out, ec);
    if (f == "deepmd" && empty_dir) {
      // A new, empty directory is DeePMD's usual target: nothing in it is lost.
    } else if (!overwrite) {
      throw DataError(path + ": exists; nothing is overwritten (choose a new name, or pass --overwrite to "
                             "replace it)");
    } else if (fs::is_directory(status) != (f == "deepmd")) {
      throw DataError(path + ": --overwrite replaces a " + (f == "deepmd" ? "directory" : "file") + " by a " +
                      (f == "deepmd" ? "directory" : "file") + ", got a " +
                      (fs::is_directory(status) ? "directory" : "file") + "; remove it first");
    }
  }
  // Everything goes to a name this process owns, renamed into place at the
  // end; on any failure that name is removed and `path` is untouched.
  const fs::path tmp = owned_temp_path(out);
  try {
    if (f == "deepmd") {
      write_deepmd(tmp.string(), structures);
    } else if (f == "extxyz") {
      write_extxyz(tmp.string(), structures);
    } else {
      write_ase_db(tmp.string(), structures);
    }
    if (exists && fs::is_directory(status)) {  // DeePMD: an empty directory, or --overwrite
      fs::remove_all(out, ec);
      if (ec) throw DataError(path + ": cannot be replaced (" + ec.message() + ")");
    }
    fs::rename(tmp, out, ec);
    if (ec) throw DataError(path + ": cannot be written (" + ec.message() + ")");
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
}

}  // namespace crucible
