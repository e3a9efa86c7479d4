#pragma once
// Parity plots of predictions against references (`crucible evaluate
// --parity parity.svg`, issues 17 and 47): plain SVG text, no plotting
// dependency. A rendered example: docs/plots/parity.png.

#include <cstddef>
#include <string>
#include <vector>

namespace crucible {

/// Reference and predicted values, paired by index, each pair with the
/// index of its structure's config_type in `groups`.
struct ParityData {
  std::string title;                            ///< e.g. "model runs/x on valid.xyz".
  std::vector<std::string> groups;              ///< config_type names, in order of first appearance.
  std::vector<double> energy_ref, energy_pred;  ///< per structure, eV/atom.
  std::vector<int> energy_group;
  std::vector<double> forces_ref, forces_pred;  ///< every force component, eV/Å.
  std::vector<int> forces_group;
  std::vector<double> stress_ref, stress_pred;  ///< every stress component, eV/Å³.
  std::vector<int> stress_group;
  /// Index of `config_type` in groups, appended when new.
  int group_of(const std::string& config_type);
};

/// At most this many points are drawn per panel.
inline constexpr size_t kParityMaxPoints = 5000;

/// Square panels side by side: energy per atom, force components, and
/// stress components where there are any. Each has the y = x line, one
/// `<circle class="point">` per drawn pair (every k-th pair when there are
/// more than kParityMaxPoints, k = ceil(n / kParityMaxPoints), stated in the
/// panel), round ticks (nice_ticks, offset notation where needed), axis
/// titles with units, and MAE and RMSE over every pair (meV/atom, meV/Å,
/// meV/Å³) with the count. Points are coloured by config_type, with a legend,
/// when there are several. The title heads the figure. A panel without pairs
/// says "no data"; non-finite pairs are skipped. Never throws.
std::string parity_svg(const ParityData& data);

/// Writes parity_svg(data) to `path` through "<path>.tmp" and a rename.
/// @throws DataError naming the path if the file cannot be written.
void write_parity_svg(const std::string& path, const ParityData& data);

}  // namespace crucible
