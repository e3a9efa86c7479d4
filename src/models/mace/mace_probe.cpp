// The import's check of a runnable MACE file (issue 46): MACE's own
// TorchScript module and the imported model on one probe structure.

#include "crucible/common/error.h"
#include "crucible/data/batch.h"
#include "crucible/data/structure.h"
#include "crucible/models/mace/mace_import.h"
#include "crucible/neighbors/neighbor_list.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>

#include <cmath>

namespace crucible {

ProbeResult probe_against_torchscript(const MaceFile& file, const MaceImpl& model) {
  if (!file.script) throw DataError(file.path + ": has no runnable MACE module to compare with");
  const std::vector<int64_t> elements = model.elements();
  const int64_t N = 8, nE = static_cast<int64_t>(elements.size());
  // 2x2x2 sites of a sheared cell, each moved off its site by up to 0.2 Å.
  Structure s;
  s.cell = at::tensor(std::vector<double>{4.9, 0.0, 0.0, 0.3, 4.8, 0.0, -0.2, 0.25, 5.0}, at::kDouble).view({3, 3});
  s.pbc = {true, true, true};
  std::vector<double> frac;
  std::vector<int64_t> z;
  for (int64_t k = 0; k < N; ++k) {
    for (int64_t a = 0; a < 3; ++a) {
      const double site = 0.5 * static_cast<double>((k >> a) & 1);
      frac.push_back(site + 0.04 * std::sin(1.7 * static_cast<double>(3 * k + a) + 0.3));
    }
    z.push_back(elements[static_cast<size_t>(k % nE)]);
  }
  s.positions = at::matmul(at::tensor(frac, at::kDouble).view({N, 3}), s.cell);
  s.atomic_numbers = at::tensor(z, at::kLong);
  const NeighborList nl = build_neighbor_list(s.positions, s.cell, s.pbc, model.cutoff());
  const Batch batch = collate({&s}, {&nl});

  ProbeResult r;
  r.atoms = N;
  r.edges = nl.num_edges();
  // Crucible, float64 copy.
  std::shared_ptr<EnergyModel> mine = model.clone_model();
  mine->module().to(at::kDouble);
  // The import's exactness: the radial MLP itself, not its spline (issue 48).
  std::dynamic_pointer_cast<MaceImpl>(mine)->set_radial_spline(false);
  const ModelOutputs ours = compute_outputs(*mine, batch, ComputeOptions{});
  // MACE's module, float64 copy (what MACECalculator(default_dtype="float64") does).
  torch::jit::Module theirs = file.script->clone();
  theirs.to(at::kDouble);
  theirs.eval();
  at::Tensor node_attrs = at::zeros({N, nE}, at::kDouble);
  for (int64_t k = 0; k < N; ++k) node_attrs[k][k % nE] = 1.0;
  // MACE: edge_index = (sender, receiver), vector = r_receiver − r_sender + shift.
  const at::Tensor unit_shifts = (-nl.shifts).to(at::kDouble);
  c10::Dict<std::string, at::Tensor> data;
  data.insert("positions", s.positions.clone());
  data.insert("node_attrs", node_attrs);
  data.insert("edge_index", at::stack({nl.edge_index[1], nl.edge_index[0]}).contiguous());
  data.insert("unit_shifts", unit_shifts);
  data.insert("shifts", at::matmul(unit_shifts, s.cell));
  data.insert("cell", s.cell.clone());
  data.insert("batch", at::zeros({N}, at::kLong));
  data.insert("ptr", at::tensor(std::vector<int64_t>{0, N}, at::kLong));
  data.insert("head", at::zeros({1}, at::kLong));
  c10::IValue out;
  try {
    out = theirs.forward({data, /*training=*/false, /*compute_force=*/true, /*compute_virials=*/false,
                          /*compute_stress=*/false});
  } catch (const std::exception& e) {
    std::string why = e.what();
    throw DataError(file.path + ": MACE's own module failed on the probe structure (" + why.substr(0, why.find('\n')) + ")");
  }
  const auto dict = out.toGenericDict();
  const at::Tensor e = dict.at("energy").toTensor().detach(), f = dict.at("forces").toTensor().detach();
  r.energy = std::abs(ours.energy[0].item<double>() - e[0].item<double>()) / std::max(std::abs(e[0].item<double>()), 1e-300);
  r.forces = (ours.forces.detach() - f).abs().max().item<double>() / std::max(f.abs().max().item<double>(), 1e-300);
  return r;
}

}  // namespace crucible
