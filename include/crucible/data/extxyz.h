#pragma once
// Extended XYZ reader and writer (the format ASE, MACE and NequIP read).

#include "crucible/data/structure.h"

#include <string>
#include <string_view>
#include <vector>

namespace crucible {

/// How to map extxyz keys and units onto a Structure.
struct ExtxyzOptions {
  /// Header key of the total energy (eV after scaling). Default "energy".
  std::string energy_key = "energy";
  /// Per-atom Properties column of forces. Empty (default) = "forces", or
  /// "force" if there is no "forces" column.
  std::string forces_key = "";
  /// Header key of the stress: 9 values (row-major 3x3) or 6 Voigt values in
  /// ASE order xx yy zz yz xz xy. Default "stress".
  std::string stress_key = "stress";
  /// Header key of the virial (9 or 6 values, eV); converted to
  /// stress = -virial / volume when no stress is given. Default "virial".
  std::string virial_key = "virial";
  /// Multiplies energies (and virials) on read: e.g. 0.0433641 for kcal/mol → eV.
  /// Default 1 (already eV).
  double energy_unit = 1.0;
  /// Multiplies forces on read (kcal/mol/Å → eV/Å: 0.0433641). Default 1.
  double forces_unit = 1.0;
  /// Multiplies stresses on read. Default 1 (already eV/Å³).
  double stress_unit = 1.0;
  /// Bytes the structures read may hold in memory (structures_bytes);
  /// readers refuse a file beyond it before holding more, naming the file,
  /// the frame and the figures (issue 47). 0 = no bound.
  double memory_budget_bytes = 0;
};

/// Bytes a data set holds in memory once read (Structure objects: tensors
/// with their headers, strings, label maps): `frames` × 4 KiB + `atoms` ×
/// 56 B (positions and forces in float64, atomic numbers in int64).
/// Measured on 40000 three-atom water frames (4.2 KB a frame with their
/// neighbor lists) and 400 256-atom Cu cells (AMD EPYC, LibTorch 1.13).
/// Never throws.
inline double structures_bytes(int64_t frames, int64_t atoms) {
  return 4096.0 * static_cast<double>(frames) + 56.0 * static_cast<double>(atoms);
}

/// @throws DataError "<where>: the N structures read so far (M atoms) would hold about X GB in memory (4 KiB a
///   structure + 56 B an atom), more than the Y GB available; ..." when `budget_bytes` > 0 and
///   structures_bytes(frames, atoms) exceeds it.
void check_structures_memory(int64_t frames, int64_t atoms, double budget_bytes, const std::string& where);

/// Reads every frame of an extxyz file.
///
/// Supports: `Properties=` with any columns in any order (species:S, pos:R:3
/// required; Z:I optional), columns changing between frames, quoted values
/// with spaces, `Lattice="..."` with any spacing, pbc as "T T T", [T, T, T]
/// or absent (then periodic iff a Lattice is given, as ASE does).
/// Returned tensors are float64 / int64 on CPU.
///
/// Details (as ASE 3.22 unless noted):
/// - Header values are bare, or quoted with "...", '...', {...} or [...];
///   backslash escapes the next character; spaces around '=' are allowed;
///   a key without '=' is a True flag (info value "T"). Lists split on
///   whitespace and commas. `Lattice`, `Properties` and `pbc` are matched
///   case-insensitively, every other key exactly.
/// - Lattice: 9 numbers, cell rows a, b, c. No Lattice: cell = zeros [3,3].
/// - Species symbols are capitalised ("TI" -> Ti); when a Z:I:1 column is
///   present it gives the atomic numbers (the species column is ignored).
/// - Stress (options.stress_key) wins over virial; a virial is converted to
///   stress = -virial * energy_unit / volume and needs a Lattice. A virial
///   that is not used is kept in `info`.
/// - `config_type` (default "Default"), `config_weight`,
///   `config_energy_weight`, `config_forces_weight`, `config_stress_weight`
///   go to the Structure fields; every other key goes to `info` as raw text.
/// - Blank lines between and after frames are skipped (ASE stops at the
///   first one). An atom line must have exactly the Properties column count.
/// - Structure::source is "<path>:<line>" of the frame's comment line.
///
/// @throws DataError "<path>:<line>: <what> must be <expected>, got <actual>"
///         for a truncated frame, a non-numeric field, a missing or short
///         Properties column, an atom line with the wrong column count (a
///         wrong atom count), an atom count that is not an integer, an
///         unknown element, a Lattice that is not 9 numbers, a stress or
///         virial that is neither 6 nor 9 numbers, a virial without a cell,
///         a bad pbc, energy or weight; "<path>: file must be readable, ..."
///         for an unreadable file.
///
/// Limits (hostile input): an atom count is checked against the bytes left
/// in the file (each atom line needs two bytes per column) before anything is
/// sized from it; Properties may declare at most 65536 values per atom line.
/// NaN or Inf in positions, forces, Lattice, energy, stress, virial or a
/// config weight is a DataError naming the file, line and column; other
/// per-atom columns (charges, ...) may hold any number.
std::vector<Structure> read_extxyz(const std::string& path, const ExtxyzOptions& options = {});

/// As read_extxyz, for extxyz text already in memory; `name` stands for the
/// path in Structure::source and in error messages. Same errors and limits.
std::vector<Structure> read_extxyz_text(std::string_view text, const std::string& name,
                                        const ExtxyzOptions& options = {});

/// Writes frames as extxyz that `ase.io.read(path, index=":")` reads back
/// (energy, forces, stress in eV units; values printed with 17 significant
/// digits so float64 round-trips exactly).
///
/// Per frame: the atom count, then `Lattice="..."` (only when the cell is not
/// all zeros), `Properties=species:S:1:pos:R:3[:forces:R:3]`, `energy=`,
/// `stress="<9 values, row-major>"`, `pbc="T T F"`, `config_type=`, the
/// `config_*weight` keys that differ from 1, then the `info` entries (quoted
/// and escaped as needed; keys the writer emits itself are skipped).
/// Positions [N,3], atomic_numbers [N] (1..118), forces [N,3] and stress /
/// cell [3,3] may be any dtype convertible to float64 / int64.
/// @throws DataError if the file cannot be written or a structure has
///         tensors of the wrong shape or an atomic number outside 1..118.
void write_extxyz(const std::string& path, const std::vector<Structure>& structures);

/// Chemical symbol → atomic number (1..118). @throws DataError if unknown.
int64_t atomic_number(const std::string& symbol);
/// Atomic number → chemical symbol. @throws DataError if out of range.
const std::string& chemical_symbol(int64_t z);
/// The chemical symbols of `zs` joined by `separator` ("Al Ti"); "" for
/// none. @throws DataError for an atomic number outside 1..118.
std::string element_symbols(const std::vector<int64_t>& zs, const std::string& separator = " ");

}  // namespace crucible
