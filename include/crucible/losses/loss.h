#pragma once
// Supervised losses on energy, forces and stress: MSE, MAE and Huber terms,
// per-config_type weights, weight normalization and loss-weight schedules.

#include "crucible/data/batch.h"
#include "crucible/losses/loss_weight_schedule.h"
#include "crucible/models/energy_model.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crucible {

/// Result of a loss: the weighted total and every unweighted component.
struct LossOutput {
  at::Tensor total;                               ///< scalar, Σ_k w_k · L_k.
  std::map<std::string, at::Tensor> components;   ///< name → scalar L_k (unweighted).
  std::map<std::string, double> weights;          ///< name → w_k actually used.
};

/// Element-wise penalty ℓ(d) of an error d (prediction - reference):
/// MSE d², MAE |d|, Huber (torch.nn.functional.huber_loss, reduction
/// "none"): ½d² if |d| < δ, else δ(|d| - ½δ).
enum class LossKind { MSE, MAE, Huber };

/// How the forces error of an atom enters ℓ: per Cartesian component, or
/// through the Euclidean norm |F_pred - F_ref|₂ of the atom's error vector.
enum class ForcesMode { Component, Vector };

/// "mse", "mae", "huber".
std::string to_string(LossKind kind);
/// Inverse of to_string (lower case). @throws std::invalid_argument otherwise.
LossKind parse_loss_kind(const std::string& text);
/// "component", "vector".
std::string to_string(ForcesMode mode);
/// Inverse of to_string. @throws std::invalid_argument otherwise.
ForcesMode parse_forces_mode(const std::string& text);

/// A loss term L(pred, batch) → scalar (0-dim tensor, dtype and device of
/// predictions; labels and weights are cast to them). A batch with no
/// labelled item gives an exact 0 that is still connected to the graph;
/// then the term's own prediction may be undefined (the training forward
/// skips stress for a batch without stress labels: mixed periodic / molecular
/// data, issue 14), and the 0 hangs off another prediction instead.
/// Unlabelled items are excluded with masks (at::where on the error before
/// the penalty, not a multiplication by 0): a NaN prediction there reaches
/// neither the value nor the gradient (which is exactly 0 there).
///
/// Every term is a weighted mean over the labelled items i of its property:
///   L = Σ_i w_i ℓ(d_i) / max(n_labelled_items, 1),
/// w_i = weight_s · <x>_weight_s · c_s of the item's structure s, where c_s
/// is the optional extra factor `structure_weight` (1 when undefined; the
/// config_type weight in WeightedSumLoss). This is the "weighted" loss of MACE
/// (Batatia et al., NeurIPS 2022, mace/modules/loss.py), divided by the count
/// of labelled items, not by Σ w_i.
class LossFunction {
 public:
  virtual ~LossFunction() = default;
  /// The term with the batch's own weights: evaluate(pred, batch, {}).
  at::Tensor operator()(const ModelOutputs& pred, const Batch& batch) const {
    return evaluate(pred, batch, at::Tensor());
  }
  /// The term with each structure's weight further multiplied by
  /// `structure_weight` ([B] floating, any device; undefined = all 1).
  /// @throws std::invalid_argument if the needed prediction or label is
  ///         undefined while some structure of the batch has that label,
  ///         shapes differ, or structure_weight is not [B].
  virtual at::Tensor evaluate(const ModelOutputs& pred, const Batch& batch,
                              const at::Tensor& structure_weight) const = 0;
  /// Component name ("energy", "forces", "stress").
  virtual std::string name() const = 0;
  /// Which outputs the term needs (forces / stress).
  virtual bool needs_forces() const { return false; }
  virtual bool needs_stress() const { return false; }
};

/// Energy term over structures with energy (pred.energy and batch.energy
/// [B], eV): d_s = (E_pred - E_ref)/N_s when `per_atom` (eV/atom), else
/// E_pred - E_ref (eV); L = Σ_s w_s ℓ(d_s) / n_s with w_s = weight ·
/// energy_weight (· structure_weight). Units: MSE eV²(/atom²), MAE eV(/atom),
/// Huber as MSE with δ in eV(/atom).
class EnergyLoss : public LossFunction {
 public:
  /// `delta` (δ of Huber, ignored by MSE/MAE; default 1 as PyTorch).
  /// @throws std::invalid_argument if kind is Huber and delta is not finite and > 0.
  explicit EnergyLoss(LossKind kind = LossKind::MSE, bool per_atom = true, double delta = 1.0);
  at::Tensor evaluate(const ModelOutputs& pred, const Batch& batch,
                      const at::Tensor& structure_weight) const override;
  std::string name() const override { return "energy"; }
  LossKind kind() const { return kind_; }
  bool per_atom() const { return per_atom_; }
  double delta() const { return delta_; }

 private:
  LossKind kind_;
  bool per_atom_;
  double delta_;
};

/// Forces term over atoms whose structure has forces (pred.forces and
/// batch.forces [N,3], eV/Å), w_i = weight · forces_weight (· structure_weight)
/// of the atom's structure:
///  - Component: L = Σ_{i,α} w_i ℓ(ΔF_iα) / (3 n_atoms), every Cartesian component;
///  - Vector: L = Σ_i w_i ℓ(|ΔF_i|₂) / n_atoms — MSE the mean squared norm,
///    MAE the mean norm, Huber huber_loss(|ΔF_i|₂, 0, δ).
/// Units: MSE eV²/Å², MAE eV/Å, Huber as MSE with δ in eV/Å.
class ForcesLoss : public LossFunction {
 public:
  /// @throws std::invalid_argument if kind is Huber and delta is not finite and > 0.
  explicit ForcesLoss(LossKind kind = LossKind::MSE, ForcesMode mode = ForcesMode::Component,
                      double delta = 1.0);
  at::Tensor evaluate(const ModelOutputs& pred, const Batch& batch,
                      const at::Tensor& structure_weight) const override;
  std::string name() const override { return "forces"; }
  bool needs_forces() const override { return true; }
  LossKind kind() const { return kind_; }
  ForcesMode mode() const { return mode_; }
  double delta() const { return delta_; }

 private:
  LossKind kind_;
  ForcesMode mode_;
  double delta_;
};

/// Stress term over the 9 components of structures with stress (pred.stress
/// and batch.stress [B,3,3], eV/Å³): L = Σ_{s,αβ} w_s ℓ(Δσ_sαβ) / (9 n_s),
/// w_s = weight · stress_weight (· structure_weight). Units: MSE (eV/Å³)²,
/// MAE eV/Å³, Huber as MSE with δ in eV/Å³.
class StressLoss : public LossFunction {
 public:
  /// @throws std::invalid_argument if kind is Huber and delta is not finite and > 0.
  explicit StressLoss(LossKind kind = LossKind::MSE, double delta = 1.0);
  at::Tensor evaluate(const ModelOutputs& pred, const Batch& batch,
                      const at::Tensor& structure_weight) const override;
  std::string name() const override { return "stress"; }
  bool needs_stress() const override { return true; }
  LossKind kind() const { return kind_; }
  double delta() const { return delta_; }

 private:
  LossKind kind_;
  double delta_;
};

/// Energy MSE (EnergyLoss(MSE, per_atom)): mean over structures with energy of
/// w_s · ((E_pred - E_ref)/N_s)² when `per_atom` (default, eV²/atom²),
/// else w_s · (E_pred - E_ref)² (eV²). w_s = weight · energy_weight.
class EnergyMSELoss : public EnergyLoss {
 public:
  explicit EnergyMSELoss(bool per_atom = true) : EnergyLoss(LossKind::MSE, per_atom) {}
};

/// Forces MSE (ForcesLoss(MSE, Component)): mean over force components of
/// atoms whose structure has forces, each weighted by its structure's
/// weight · forces_weight (eV²/Å²).
class ForcesMSELoss : public ForcesLoss {
 public:
  ForcesMSELoss() : ForcesLoss(LossKind::MSE, ForcesMode::Component) {}
};

/// Stress MSE (StressLoss(MSE)): mean over the 9 components of structures
/// with stress, weighted by weight · stress_weight ((eV/Å³)²).
class StressMSELoss : public StressLoss {
 public:
  StressMSELoss() : StressLoss(LossKind::MSE) {}
};

/// Weighted sum Σ_k w_k L_k; returns the total and each component.
/// A component with no labels in the batch contributes 0.
///
/// Term weights w_k come from a LossWeightSchedule evaluated at the counters
/// set by set_progress (0, 0 until set); a plain double is a ConstantWeight.
/// With set_normalize_weights(true) the total is Σ_k w_k L_k / Σ_k w_k.
/// Config_type weights (MACE's `config_type_weights`: a structure's weight is
/// multiplied by the weight of its config_type, 1 if not listed) reach every
/// term as LossFunction::evaluate's `structure_weight`.
/// Copies share the (immutable) terms and schedules.
class WeightedSumLoss {
 public:
  /// Adds a term with a constant weight.
  /// @throws std::invalid_argument on a null term, a negative or non-finite
  ///         weight, or a duplicate name.
  void add(std::shared_ptr<LossFunction> term, double weight);
  /// Adds a term whose weight follows `schedule`.
  /// @throws std::invalid_argument on a null term or schedule, or a duplicate name.
  void add(std::shared_ptr<LossFunction> term, std::shared_ptr<const LossWeightSchedule> schedule);

  /// Sets the step and epoch counters the schedules read at the next calls.
  /// Nothing needs checkpointing: the weights are a pure function of these
  /// counters, so a resumed run only calls set_progress again.
  /// @throws std::invalid_argument if a counter is negative.
  void set_progress(int64_t step, int64_t epoch);
  int64_t step() const { return step_; }
  int64_t epoch() const { return epoch_; }

  /// Per-config_type weights (each >= 0 and finite); replaces the previous map.
  /// Types not in the map weigh 1; an empty map turns the feature off.
  /// @throws std::invalid_argument naming the config_type of a bad weight.
  void set_config_type_weights(std::map<std::string, double> weights);
  const std::map<std::string, double>& config_type_weights() const { return config_type_weights_; }

  /// When true, total = Σ_k w_k L_k / Σ_k w_k and `weights` reports w_k / Σ_j w_j
  /// (all 0 when Σ_k w_k = 0, so the total is then an exact 0). Default false.
  void set_normalize_weights(bool normalize) { normalize_weights_ = normalize; }
  bool normalize_weights() const { return normalize_weights_; }

  /// Each term at the current counters; components are the unweighted L_k
  /// (scalars, dtype/device of the predictions).
  /// With no terms, total = pred.energy.sum() * 0 (needs pred.energy).
  /// @throws std::invalid_argument if a term throws, a schedule gives a
  ///         negative or non-finite weight, or config_type weights are set and
  ///         batch.config_types does not have B entries.
  LossOutput operator()(const ModelOutputs& pred, const Batch& batch) const;
  /// The weight of every term at the current counters (before normalization).
  std::map<std::string, double> current_weights() const;
  bool needs_forces() const;
  bool needs_stress() const;
  bool empty() const { return terms_.empty(); }

 private:
  struct Term {
    std::shared_ptr<LossFunction> fn;
    std::shared_ptr<const LossWeightSchedule> schedule;
  };
  double weight_of(const Term& term) const;
  std::vector<Term> terms_;
  std::map<std::string, double> config_type_weights_;
  bool normalize_weights_ = false;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace crucible
