#pragma once
// Parity plots of predictions against references (`crucible evaluate
// --parity parity.svg`, issue 17): plain SVG text, no plotting dependency.

#include <string>
#include <vector>

namespace crucible {

/// Reference and predicted values, paired by index.
struct ParityData {
  std::vector<double> energy_ref, energy_pred;  ///< per structure, eV/atom.
  std::vector<double> forces_ref, forces_pred;  ///< every force component, eV/Å.
};

/// Two square panels side by side (energy per atom, force components), each
/// with the y = x line, one `<circle class="point">` per pair (forces: at
/// most 20000, evenly strided), axes with the range of both series, labels
/// and the MAE (meV/atom, meV/Å). A panel without pairs says "no data";
/// non-finite pairs are skipped. Never throws.
std::string parity_svg(const ParityData& data);

/// Writes parity_svg(data) to `path` through "<path>.tmp" and a rename.
/// @throws DataError naming the path if the file cannot be written.
void write_parity_svg(const std::string& path, const ParityData& data);

}  // namespace crucible
