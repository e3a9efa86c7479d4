#pragma once
// Non-finite values in binary data files (issue 47): NaN and ±inf stored as
// doubles in DeePMD .npy files and ASE databases are refused at read time,
// naming the frame, as the extxyz reader refuses such text.

#include "crucible/data/structure.h"

namespace crucible {

/// Refuses a structure whose positions, cell or labels (energy, forces,
/// stress) hold NaN or ±inf, naming the first one: "<source>: forces must be
/// finite numbers, got nan (atom 3, component 0)". For readers whose file
/// format stores binary doubles (DeePMD .npy, ASE databases); the extxyz
/// reader refuses such text itself. Never reads more than the tensors.
/// @throws DataError with Structure::source.
void check_finite_values(const Structure& structure);

}  // namespace crucible
