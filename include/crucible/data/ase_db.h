#pragma once
// ASE databases (SQLite .db files, the `systems` table of ase.db, format
// version 9 as written by ASE 3.22), read and written with libsqlite3
// (issue 18).
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
/// text). The `data` column (ASE-encoded JSON) is not read. Structure::columns
/// lists the label columns the row stores (energy, forces, stress), so an
/// energy column that energy_key does not name is found by the label audit;
/// forces_key or stress_key "none" leaves that column out.
/// source = "PATH id N". @throws DataError naming the file and row: not a
/// SQLite file, no `systems` table, a blob whose size does not match natoms,
/// an atomic number outside 1..118.
std::vector<Structure> read_ase_db(const std::string& path, const ExtxyzOptions& options = {});

/// Writes `structures` as a new ASE database (schema version 9, the tables
/// and indices ASE 3.22 creates, so ase.db.connect reads it and queries it by
/// key): one `systems` row per structure with numbers, positions, cell,
/// pbc, energy, forces, stress (6 Voigt values), natoms, fmax, smax, volume,
/// and the key-value pairs config_type (unless Default) and every `info`
/// entry whose key is an identifier (numbers stay numbers). Written to
/// <path>.crucible-<pid>.tmp (removed on failure) and renamed.
/// @throws DataError if `path` or that name exists, or cannot be written.
void write_ase_db(const std::string& path, const std::vector<Structure>& structures);

}  // namespace crucible
