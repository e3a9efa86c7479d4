#pragma once
// Error metrics of a model on a dataset, in the units MLIP papers report.

#include "crucible/data/dataset.h"
#include "crucible/models/energy_model.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>

namespace crucible {

/// Energy, forces and stress errors. Energies per atom in meV/atom, forces
/// per Cartesian component in meV/Å, stress per component in meV/Å³.
/// Metrics whose labels are absent are reported as NaN with count 0.
struct ValidationSummary {
  double energy_mae = 0, energy_rmse = 0;  ///< meV/atom: |E_pred - E_ref| / N.
  double forces_mae = 0, forces_rmse = 0;  ///< meV/Å over all components.
  double stress_mae = 0, stress_rmse = 0;  ///< meV/Å³ over 9 components.
  /// Force MAE (meV/Å) of a model that predicts zero forces: mean |F_ref|.
  double zero_forces_mae = 0;
  int64_t num_energies = 0;  ///< structures with an energy label.
  int64_t num_forces = 0;    ///< force components compared.
  int64_t num_stresses = 0;  ///< stress components compared.
  int64_t num_structures = 0;
  /// True when the strategy evaluated its inference model (EMA weights)
  /// rather than the live training model.
  bool inference_model = false;
  /// Metrics by name ("energy_mae", "forces_rmse", ...), for CSV and schedulers.
  std::map<std::string, double> as_map() const;
};

/// Accumulates sums of errors batch by batch (so multi-batch and, later,
/// multi-rank results are sums and counts, not means of means).
class MetricsAccumulator {
 public:
  /// Adds one batch. `pred` tensors may be undefined (then skipped).
  /// Energies in eV, forces eV/Å, stress eV/Å³; any float dtype / device.
  void add(const ModelOutputs& pred, const Batch& batch);
  /// Mean/RMS values in meV units.
  ValidationSummary summary() const;

 private:
  double e_abs_ = 0, e_sq_ = 0, f_abs_ = 0, f_sq_ = 0, s_abs_ = 0, s_sq_ = 0, f_zero_ = 0;
  int64_t n_e_ = 0, n_f_ = 0, n_s_ = 0, n_struct_ = 0;
};

/// Options of `evaluate_model`.
struct EvaluateOptions {
  int64_t batch_size = 16;   ///< structures per batch. Default 16.
  bool stress = true;        ///< compute stress for periodic structures. Default true.
  at::ScalarType dtype = at::kFloat;  ///< float dtype of the model. Default float32.
};

/// Evaluates `model` on every structure of `dataset` (in order) on `device`,
/// with autograd enabled for forces but without graphs for parameters.
/// The model is put in eval mode and restored to its previous mode after.
ValidationSummary evaluate_model(EnergyModel& model, const AtomicDataset& dataset,
                                 at::Device device, const EvaluateOptions& options = {});

}  // namespace crucible
