#pragma once
// ASE databases (SQLite .db files, the `systems` table of ase.db, format
// version 9 as written by ASE 3.22), read with libsqlite3 (issue 18).
// Reference: ase/db/sqlite.py (ASE 3.22).

#include "crucible/data/extxyz.h"
#include "crucible/data/structure.h"

#include <string>
#include <vector>

namespace crucible {

/// True if `path` starts with the SQLite header ("SQLite format 3").
/// Never throws.
bool is_sqlite_file(const std::string& path);

/// Reads every row of the `systems` table in id order: numbers (int32
/// blob), positions [N,3] and cell [3,3] (float64 blobs, Å), pbc (bit mask),
/// energy (× options.energy_unit; with options.energy_key other than
/// "energy", the number in that key-value pair instead of the column), forces [N,3] (× forces_unit), stress (6 Voigt
/// or 9 values, eV/Å³ ASE sign, × stress_unit). Key-value pairs:
/// config_type sets Structure::config_type, the others go to `info` (as
/// text). The `data` column (ASE-encoded JSON) is not read.
/// source = "PATH id N". @throws DataError naming the file and row: not a
/// SQLite file, no `systems` table, a blob whose size does not match natoms,
/// an atomic number outside 1..118.
std::vector<Structure> read_ase_db(const std::string& path, const ExtxyzOptions& options = {});

}  // namespace crucible
