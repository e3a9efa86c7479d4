#pragma once
// Data formats chosen by data.format (issue 18): extended XYZ, DeePMD npy
// systems, ASE SQLite databases; `auto` picks by path.

#include "crucible/data/extxyz.h"
#include "crucible/data/structure.h"

#include <string>
#include <vector>

namespace crucible {

/// The format of `path` for data.format=auto: "deepmd" for a directory
/// holding a DeePMD system (type.raw) in it or below, "ase_db" for a .db or
/// SQLite file, else "extxyz".
/// @throws DataError for a directory without a DeePMD system, or a DeePMD
///         member file (.npy, .raw) given instead of its system directory.
std::string detect_format(const std::string& path);

/// Reads `path` in `format` (auto, extxyz, deepmd, ase_db); options give the
/// extxyz keys and every format's units. @throws DataError naming the file.
std::vector<Structure> read_structures(const std::string& path, const std::string& format,
                                       const ExtxyzOptions& options = {});

/// Writes `structures` to `path` in `format` (extxyz, deepmd, ase_db; auto
/// = extxyz for .xyz / .extxyz, ase_db for .db, else a DeePMD directory).
/// Nothing already there is lost unless `overwrite`: an existing `path`
/// (other than an empty directory for DeePMD) is refused. The output is
/// written under a temporary name this process owns in the same folder
/// (.<name>.crucible-<pid>-<random>.tmp) and renamed into place at the end;
/// on failure that name is removed and `path` is as it was.
/// @throws DataError naming the path and the cause (an existing output, a
///   file where a directory goes or the reverse, an I/O error, a structure
///   the format cannot hold).
void write_structures(const std::string& path, const std::string& format, const std::vector<Structure>& structures,
                      bool overwrite = false);

}  // namespace crucible
