#pragma once
// DeePMD-kit's npy systems (issue 18): type.raw, type_map.raw, optional
// nopbc, and set.*/{coord,box,energy,force,virial}.npy. Reference: the
// DeePMD-kit documentation, "Data: System" (docs/data/system.md) and dpdata's
// deepmd/npy format.

#include "crucible/data/extxyz.h"
#include "crucible/data/structure.h"

#include <string>
#include <vector>

namespace crucible {

/// True if `path` is a DeePMD system (a directory with type.raw) or a
/// directory holding such systems anywhere below it. Never throws.
bool is_deepmd_path(const std::string& path);

/// Reads a DeePMD system directory, or every system below a directory (in
/// sorted path order), frames of each system in set.* order. Per frame:
/// positions coord.npy [nframes, natoms*3] (Å), cell box.npy [nframes, 9]
/// rows a, b, c (Å; all periodic unless the system has a `nopbc` file),
/// energy.npy [nframes] (× options.energy_unit), force.npy [nframes,
/// natoms*3] (× options.forces_unit), virial.npy [nframes, 9] as stress =
/// -virial / volume (× options.energy_unit; the sign of the extxyz virial
/// and of dpdata). float32 or float64 arrays, little-endian (read_npy).
/// options.energy_key / forces_key / virial_key "none" leaves energy.npy /
/// force.npy / virial.npy unread; a virial.npy of a nopbc system or a box of
/// volume 0 is refused (it has no stress).
/// Elements from type_map.raw (required). source = "SYSTEM/set.000 frame k".
/// @throws DataError naming the file: no system, a missing type.raw /
///         type_map.raw / coord.npy, a type outside type_map, an unknown element,
///         shapes that do not match natoms or the frame count.
std::vector<Structure> read_deepmd(const std::string& path, const ExtxyzOptions& options = {});

/// Writes `structures` as DeePMD systems under the new or empty directory
/// `dir`: one system (system_000, system_001, ...) per run of the same atoms
/// (atomic numbers in order), periodicity and labels, in order of first
/// appearance; float64 arrays; stress as virial = -stress × volume.
/// @throws DataError if `dir` is not new or empty, a frame is periodic along
///         only some directions (DeePMD has all or none), a non-periodic frame
///         has a stress (DeePMD's virial needs a box), or a file cannot be
///         written.
void write_deepmd(const std::string& dir, const std::vector<Structure>& structures);

}  // namespace crucible
