// Weighted mean-squared-error losses on energy, forces and stress (the
// "weighted" loss of MACE, Batatia et al., NeurIPS 2022: per-structure
// weight × per-property weight, mean over the labelled items).
//
// Unlabelled items are excluded with at::where (not multiplied by 0), so a
// NaN prediction for an unlabelled structure cannot leak into the loss, and
// the denominators are clamped to 1 so a batch without a label gives an exact
// zero (on the predictions' device and dtype, still connected to the graph)
// without a device→host synchronisation.

#include "crucible/losses/loss.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

namespace crucible {
namespace {

void require(const at::Tensor& t, const char* loss, const char* what) {
  if (!t.defined()) {
    throw std::invalid_argument(std::string(loss) + ": " + what + " is not defined");
  }
}

/// Σ where(mask, values, 0) / max(count, 1): values and mask broadcastable.
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask, const at::Tensor& count) {
  const at::Tensor total = at::where(mask, values, at::zeros_like(values)).sum();
  return total / count.clamp_min(1).to(values.scalar_type());
}

}  // namespace

at::Tensor EnergyMSELoss::operator()(const ModelOutputs& pred, const Batch& batch) const {
  require(pred.energy, "EnergyMSELoss", "predicted energy");
  require(batch.energy, "EnergyMSELoss", "batch.energy");
  const auto dtype = pred.energy.scalar_type();
  const at::Tensor mask = batch.has_energy.to(pred.energy.device());             // [B] bool
  at::Tensor diff = pred.energy - batch.energy.to(pred.energy.device(), dtype);  // [B]
  if (per_atom_) diff = diff / batch.num_atoms.to(pred.energy.device(), dtype).clamp_min(1);
  const at::Tensor w = (batch.weight * batch.energy_weight).to(pred.energy.device(), dtype);
  return masked_mean(w * diff.pow(2), mask, mask.sum());
}

at::Tensor ForcesMSELoss::operator()(const ModelOutputs& pred, const Batch& batch) const {
  require(pred.forces, "ForcesMSELoss", "predicted forces (ComputeOptions::forces)");
  require(batch.forces, "ForcesMSELoss", "batch.forces");
  const auto dtype = pred.forces.scalar_type();
  const auto device = pred.forces.device();
  const at::Tensor graph = batch.batch.to(device);
  const at::Tensor atom_mask = batch.has_forces.to(device).index_select(0, graph);  // [N]
  const at::Tensor w = (batch.weight * batch.forces_weight).to(device, dtype).index_select(0, graph);
  const at::Tensor sq = (pred.forces - batch.forces.to(device, dtype)).pow(2);      // [N,3]
  return masked_mean(w.unsqueeze(1) * sq, atom_mask.unsqueeze(1), atom_mask.sum() * 3);
}

at::Tensor StressMSELoss::operator()(const ModelOutputs& pred, const Batch& batch) const {
  require(pred.stress, "StressMSELoss", "predicted stress (ComputeOptions::stress)");
  require(batch.stress, "StressMSELoss", "batch.stress");
  const auto dtype = pred.stress.scalar_type();
  const auto device = pred.stress.device();
  const at::Tensor mask = batch.has_stress.to(device);  // [B]
  const at::Tensor w = (batch.weight * batch.stress_weight).to(device, dtype);
  const at::Tensor sq = (pred.stress - batch.stress.to(device, dtype)).pow(2);  // [B,3,3]
  return masked_mean(w.view({-1, 1, 1}) * sq, mask.view({-1, 1, 1}), mask.sum() * 9);
}

void WeightedSumLoss::add(std::shared_ptr<LossFunction> term, double weight) {
  if (!term) throw std::invalid_argument("WeightedSumLoss::add: null loss term");
  if (!(weight >= 0.0) || !std::isfinite(weight)) {
    throw std::invalid_argument("WeightedSumLoss::add: weight of '" + term->name() +
                                "' must be a finite number >= 0, got " + std::to_string(weight));
  }
  for (const auto& t : terms_) {
    if (t.first->name() == term->name()) {
      throw std::invalid_argument("WeightedSumLoss::add: duplicate loss term '" + term->name() + "'");
    }
  }
  terms_.emplace_back(std::move(term), weight);
}

LossOutput WeightedSumLoss::operator()(const ModelOutputs& pred, const Batch& batch) const {
  LossOutput out;
  for (const auto& [term, weight] : terms_) {
    at::Tensor value = (*term)(pred, batch);
    out.total = out.total.defined() ? out.total + weight * value : weight * value;
    out.components[term->name()] = value;
    out.weights[term->name()] = weight;
  }
  if (!out.total.defined()) {
    if (!pred.energy.defined()) {
      throw std::invalid_argument("WeightedSumLoss: no terms and no predicted energy");
    }
    out.total = pred.energy.sum() * 0;
  }
  return out;
}

bool WeightedSumLoss::needs_forces() const {
  for (const auto& t : terms_)
    if (t.first->needs_forces()) return true;
  return false;
}

bool WeightedSumLoss::needs_stress() const {
  for (const auto& t : terms_)
    if (t.first->needs_stress()) return true;
  return false;
}

}  // namespace crucible
