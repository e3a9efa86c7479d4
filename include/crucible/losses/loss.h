#pragma once
// Supervised losses on energy, forces and stress.

#include "crucible/data/batch.h"
#include "crucible/models/energy_model.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace crucible {

/// Result of a loss: the weighted total and every unweighted component.
struct LossOutput {
  at::Tensor total;                               ///< scalar, Σ_k w_k · L_k.
  std::map<std::string, at::Tensor> components;   ///< name → scalar L_k (unweighted).
  std::map<std::string, double> weights;          ///< name → w_k.
};

/// A loss term L(pred, batch) → scalar (0-dim tensor, dtype and device of
/// predictions; labels are cast to them). A batch with no labelled item gives
/// an exact 0 that is still connected to the graph. Unlabelled items are
/// excluded (a NaN prediction there does not reach the value).
/// @throws std::invalid_argument if the needed prediction or label is undefined.
class LossFunction {
 public:
  virtual ~LossFunction() = default;
  virtual at::Tensor operator()(const ModelOutputs& pred, const Batch& batch) const = 0;
  /// Component name ("energy", "forces", "stress").
  virtual std::string name() const = 0;
  /// Which outputs the term needs (forces / stress).
  virtual bool needs_forces() const { return false; }
  virtual bool needs_stress() const { return false; }
};

/// Energy MSE: mean over structures with energy of
/// w_s · ((E_pred - E_ref)/N_s)² when `per_atom` (default, eV²/atom²),
/// else w_s · (E_pred - E_ref)² (eV²). w_s = weight · energy_weight.
class EnergyMSELoss : public LossFunction {
 public:
  explicit EnergyMSELoss(bool per_atom = true) : per_atom_(per_atom) {}
  at::Tensor operator()(const ModelOutputs& pred, const Batch& batch) const override;
  std::string name() const override { return "energy"; }
 private:
  bool per_atom_;
};

/// Forces MSE: mean over force components of atoms whose structure has
/// forces, each weighted by its structure's weight · forces_weight (eV²/Å²).
class ForcesMSELoss : public LossFunction {
 public:
  at::Tensor operator()(const ModelOutputs& pred, const Batch& batch) const override;
  std::string name() const override { return "forces"; }
  bool needs_forces() const override { return true; }
};

/// Stress MSE: mean over the 9 components of structures with stress,
/// weighted by weight · stress_weight ((eV/Å³)²).
class StressMSELoss : public LossFunction {
 public:
  at::Tensor operator()(const ModelOutputs& pred, const Batch& batch) const override;
  std::string name() const override { return "stress"; }
  bool needs_stress() const override { return true; }
};

/// Weighted sum Σ_k w_k L_k; returns the total and each component.
/// A component with no labels in the batch contributes 0.
class WeightedSumLoss {
 public:
  /// @throws std::invalid_argument on a null term, a negative or non-finite
  ///         weight, or a duplicate name.
  void add(std::shared_ptr<LossFunction> term, double weight);
  /// With no terms, total = pred.energy.sum() * 0 (needs pred.energy).
  LossOutput operator()(const ModelOutputs& pred, const Batch& batch) const;
  bool needs_forces() const;
  bool needs_stress() const;
  bool empty() const { return terms_.empty(); }
 private:
  std::vector<std::pair<std::shared_ptr<LossFunction>, double>> terms_;
};

}  // namespace crucible
