#pragma once
// Error metrics of a model on a dataset, in the units MLIP papers report.

#include "crucible/data/dataset.h"
#include "crucible/distributed/communicator.h"
#include "crucible/models/energy_model.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace crucible {

class PrecisionPlugin;
class WeightedSumLoss;

/// Energy, forces and stress errors of a set of structures. Energies per
/// atom in meV/atom, forces per Cartesian component in meV/Å, stress per
/// component in meV/Å³. Metrics whose labels are absent are NaN with count 0.
///   MAE = Σ|e| / n,  RMSE = sqrt(Σ e² / n)
/// over the n labelled items (structures, force components, stress components).
struct ErrorMetrics {
  double energy_mae = 0, energy_rmse = 0;  ///< meV/atom: |E_pred - E_ref| / N.
  double forces_mae = 0, forces_rmse = 0;  ///< meV/Å over all components.
  double stress_mae = 0, stress_rmse = 0;  ///< meV/Å³ over 9 components.
  /// Force MAE (meV/Å) of a model that predicts zero forces: mean |F_ref|.
  double zero_forces_mae = 0;
  /// Energy RMSE (meV/atom) of a model that predicts every structure's mean
  /// energy per atom: the standard deviation of E_ref/N (population, over
  /// the labelled structures; 0 for one). An energy RMSE at or above it means
  /// the energies are not learned (issue 47). Not in as_map().
  double mean_energy_rmse = 0;
  int64_t num_energies = 0;  ///< structures with an energy label.
  int64_t num_forces = 0;    ///< force components compared.
  int64_t num_stresses = 0;  ///< stress components compared.
  int64_t num_structures = 0;
  /// Metrics by name ("energy_mae", "forces_rmse", ...), for CSV and schedulers.
  std::map<std::string, double> as_map() const;
};

/// Validation result: the metrics over every structure, the same metrics
/// for the structures of each config_type, and which model was evaluated.
struct ValidationSummary : ErrorMetrics {
  /// config_type (extxyz info key, "Default" when absent) → its metrics.
  std::map<std::string, ErrorMetrics> per_config_type;
  /// True when the strategy evaluated its inference model (EMA weights)
  /// rather than the live training model.
  bool inference_model = false;
  /// The training loss on these structures (EvaluateOptions::loss; seed 002
  /// validates with the loss function): the mean over batches of the total,
  /// each batch weighted by its structure count, in the loss's units (e.g.
  /// eV²/atom² + eV²/Å² terms for MSE). NaN when not computed.
  double loss = std::numeric_limits<double>::quiet_NaN();
  /// The unweighted terms (LossOutput::components), averaged the same way.
  std::map<std::string, double> loss_components;
};

/// Names a validation monitor (plateau schedule, best model, early
/// stopping) may take: "loss" (ValidationSummary::loss: the training loss
/// with the weights of the current stage, as MACE's validation loss) and
/// every ErrorMetrics::as_map() key except zero_forces_mae; each also with
/// a "val/" prefix. Never throws.
std::vector<std::string> validation_monitor_names();

/// The value of `monitor` (a validation_monitor_names() entry) in
/// `summary`: meV units for the metrics, the loss's units for "loss"; NaN
/// when not computed. @throws std::invalid_argument for another name,
/// listing the known ones.
double validation_monitor_value(const ValidationSummary& summary, const std::string& monitor);

/// Accumulates sums of errors batch by batch, overall and per config_type
/// (so multi-batch and, later, multi-rank results are sums and counts, not
/// means of means).
class MetricsAccumulator {
 public:
  /// Adds one batch. `pred` tensors may be undefined (then skipped).
  /// Energies in eV, forces eV/Å, stress eV/Å³; any float dtype / device.
  /// @throws std::invalid_argument if batch.config_types does not have one
  ///   entry per structure.
  void add(const ModelOutputs& pred, const Batch& batch);
  /// Mean/RMS values in meV units, overall and per config_type.
  ValidationSummary summary() const;
  /// Replaces the sums by their totals over all workers (one float64
  /// all-reduce of [(1 + types) x 13] sums and counts), so a summary is
  /// over every worker's structures, not a mean of means. `config_types`
  /// must list every type any worker may hold (e.g. all of the validation
  /// set's), identically on every worker; types with no structure in total
  /// are left out as in a single process.
  /// @throws std::invalid_argument if a held type is not in `config_types`;
  ///   DistributedError from the collective.
  void allreduce(Communicator& communicator, const std::vector<std::string>& config_types);

 private:
  struct Sums {
    double e_abs = 0, e_sq = 0, f_abs = 0, f_sq = 0, s_abs = 0, s_sq = 0, f_zero = 0;
    double e_ref = 0, e_ref_sq = 0;  // Σ E_ref/N and Σ (E_ref/N)² (eV/atom)
    int64_t n_e = 0, n_f = 0, n_s = 0, n_struct = 0;
    ErrorMetrics metrics() const;
  };
  Sums total_;
  std::map<std::string, Sums> by_type_;
};

/// Options of `evaluate_model`.
struct EvaluateOptions {
  int64_t batch_size = 16;   ///< structures per batch. Default 16.
  bool stress = true;        ///< compute stress for periodic structures. Default true.
  at::ScalarType dtype = at::kFloat;  ///< float dtype of the model. Default float32.
  /// The run's precision plugin (seed 004): when set, each batch goes through
  /// its convert_input (instead of a cast to `dtype`; geometry kept >=
  /// float32) and the predictions through its convert_output. Null = none.
  const PrecisionPlugin* precision = nullptr;
  /// Also evaluate this loss on every batch (ValidationSummary::loss). Null = no.
  const WeightedSumLoss* loss = nullptr;
  /// Data-parallel validation: with more than one worker, this worker
  /// evaluates structures rank, rank + size, ... and the sums are
  /// all-reduced (every worker returns the same summary over the whole
  /// dataset). Null = evaluate everything here.
  Communicator* communicator = nullptr;
};

/// Evaluates `model` on every structure of `dataset` (in order) on `device`,
/// with autograd enabled for forces but without graphs for parameters.
/// The model is put in eval mode and restored to its previous mode after.
/// With options.communicator (size > 1) the work is sharded and reduced.
ValidationSummary evaluate_model(EnergyModel& model, const AtomicDataset& dataset,
                                 at::Device device, const EvaluateOptions& options = {});

}  // namespace crucible
