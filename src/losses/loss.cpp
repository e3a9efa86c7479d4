// Weighted MSE / MAE / Huber losses on energy, forces and stress (the
// "weighted" loss of MACE, Batatia et al., NeurIPS 2022, mace/modules/loss.py:
// per-structure weight × per-property weight × config_type weight, mean over
// the labelled items). Huber follows torch.nn.functional.huber_loss
// (https://pytorch.org/docs/stable/generated/torch.nn.HuberLoss.html):
// ½d² if |d| < δ else δ(|d| - ½δ).
//
// Unlabelled items are excluded with at::where on the error before the
// penalty and again on the penalty (not multiplied by 0), so a NaN prediction
// for an unlabelled structure reaches neither the loss nor the gradient, and
// the denominators are clamped to 1 so a batch without a label gives an exact
// zero (on the predictions' device and dtype, still connected to the graph)
// without a device→host synchronisation.

#include "crucible/losses/loss.h"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace crucible {
namespace {

std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

void require(const at::Tensor& t, const char* loss, const char* what) {
  if (!t.defined()) {
    throw std::invalid_argument(std::string(loss) + ": " + what + " is not defined");
  }
}

void require_same_shape(const at::Tensor& pred, const at::Tensor& label, const char* loss,
                        const char* what) {
  if (!pred.sizes().equals(label.sizes())) {
    std::ostringstream s;
    s << loss << ": " << what << " must have the labels' shape " << label.sizes() << ", got "
      << pred.sizes();
    throw std::invalid_argument(s.str());
  }
}

void require_delta(LossKind kind, double delta, const char* loss) {
  if (kind == LossKind::Huber && (!(delta > 0.0) || !std::isfinite(delta))) {
    throw std::invalid_argument(std::string(loss) + ": Huber delta must be a finite number > 0, got " +
                                num(delta));
  }
}

/// [B] weight · property_weight (· structure_weight) on device/dtype.
at::Tensor structure_weights(const Batch& batch, const at::Tensor& property_weight,
                             const at::Tensor& structure_weight, const char* loss,
                             at::Device device, at::ScalarType dtype) {
  at::Tensor w = (batch.weight * property_weight).to(device, dtype);
  if (structure_weight.defined()) {
    if (structure_weight.dim() != 1 || structure_weight.size(0) != batch.num_graphs()) {
      std::ostringstream s;
      s << loss << ": structure_weight must have shape [" << batch.num_graphs() << "], got "
        << structure_weight.sizes();
      throw std::invalid_argument(s.str());
    }
    w = w * structure_weight.to(device, dtype);
  }
  return w;
}

/// Element-wise penalty ℓ(d) (see LossKind).
at::Tensor penalty(const at::Tensor& d, LossKind kind, double delta) {
  switch (kind) {
    case LossKind::MSE:
      return d.pow(2);
    case LossKind::MAE:
      return d.abs();
    case LossKind::Huber: {
      const at::Tensor a = d.abs();
      return at::where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta));
    }
  }
  throw std::invalid_argument("loss kind must be one of mse, mae, huber");
}

/// where(mask, x, 0) with mask broadcastable to x.
at::Tensor keep(const at::Tensor& x, const at::Tensor& mask) {
  return at::where(mask, x, at::zeros_like(x));
}

/// Σ where(mask, values, 0) / max(count, 1): values and mask broadcastable.
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask, const at::Tensor& count) {
  const at::Tensor total = keep(values, mask).sum();
  return total / count.clamp_min(1).to(values.scalar_type());
}

/// True if some structure of the batch carries the label (`has` [B] bool).
bool any_labelled(const at::Tensor& has) { return has.defined() && has.any().item<bool>(); }

/// An exact 0 connected to the graph of the first defined prediction (its
/// gradient is exactly 0, also where a prediction is NaN): the value of a
/// term whose batch has no label and whose prediction was not computed
/// (e.g. stress skipped for a batch of isolated molecules). Undefined
/// predictions everywhere: a plain 0 (float32, CPU).
at::Tensor unlabelled_zero(const ModelOutputs& pred) {
  for (const at::Tensor* t : {&pred.energy, &pred.forces, &pred.stress}) {
    if (t->defined()) {
      return keep(*t, at::zeros({}, t->options().dtype(at::kBool))).sum();
    }
  }
  return at::zeros({}, at::kFloat);
}

/// Row-wise Euclidean norm of x [N,3] with a zero (not NaN) gradient at 0.
at::Tensor safe_row_norm(const at::Tensor& x) {
  const at::Tensor sq = x.pow(2).sum(1);
  const at::Tensor positive = sq > 0;
  return keep(keep(sq, positive).add(at::logical_not(positive).to(sq.scalar_type())).sqrt(), positive);
}

}  // namespace

std::string to_string(LossKind kind) {
  switch (kind) {
    case LossKind::MSE: return "mse";
    case LossKind::MAE: return "mae";
    case LossKind::Huber: return "huber";
  }
  return "?";
}

LossKind parse_loss_kind(const std::string& text) {
  if (text == "mse") return LossKind::MSE;
  if (text == "mae") return LossKind::MAE;
  if (text == "huber") return LossKind::Huber;
  throw std::invalid_argument("loss kind must be one of mse, mae, huber, got '" + text + "'");
}

std::string to_string(ForcesMode mode) {
  return mode == ForcesMode::Component ? "component" : "vector";
}

ForcesMode parse_forces_mode(const std::string& text) {
  if (text == "component") return ForcesMode::Component;
  if (text == "vector") return ForcesMode::Vector;
  throw std::invalid_argument("forces mode must be one of component, vector, got '" + text + "'");
}

EnergyLoss::EnergyLoss(LossKind kind, bool per_atom, double delta)
    : kind_(kind), per_atom_(per_atom), delta_(delta) {
  require_delta(kind, delta, "EnergyLoss");
}

at::Tensor EnergyLoss::evaluate(const ModelOutputs& pred, const Batch& batch,
                                const at::Tensor& structure_weight) const {
  if (!pred.energy.defined() && !any_labelled(batch.has_energy)) return unlabelled_zero(pred);
  require(pred.energy, "EnergyLoss", "predicted energy");
  require(batch.energy, "EnergyLoss", "batch.energy");
  require_same_shape(pred.energy, batch.energy, "EnergyLoss", "predicted energy");
  // The difference in float64 in every precision mode (issue 48): a float32
  // label of a 10^4-atom cell is quantized to ~1 eV.
  const auto dtype = at::kDouble;
  const auto device = pred.energy.device();
  const at::Tensor mask = batch.has_energy.to(device);                        // [B] bool
  at::Tensor diff = pred.energy.to(dtype) - batch.energy.to(device, dtype);  // [B]
  if (per_atom_) diff = diff / batch.num_atoms.to(device, dtype).clamp_min(1);
  diff = keep(diff, mask);
  const at::Tensor w =
      structure_weights(batch, batch.energy_weight, structure_weight, "EnergyLoss", device, dtype);
  return masked_mean(w * penalty(diff, kind_, delta_), mask, mask.sum());
}

ForcesLoss::ForcesLoss(LossKind kind, ForcesMode mode, double delta)
    : kind_(kind), mode_(mode), delta_(delta) {
  require_delta(kind, delta, "ForcesLoss");
}

at::Tensor ForcesLoss::evaluate(const ModelOutputs& pred, const Batch& batch,
                                const at::Tensor& structure_weight) const {
  if (!pred.forces.defined() && !any_labelled(batch.has_forces)) return unlabelled_zero(pred);
  require(pred.forces, "ForcesLoss", "predicted forces (ComputeOptions::forces)");
  require(batch.forces, "ForcesLoss", "batch.forces");
  require_same_shape(pred.forces, batch.forces, "ForcesLoss", "predicted forces");
  const auto dtype = pred.forces.scalar_type();
  const auto device = pred.forces.device();
  const at::Tensor graph = batch.batch.to(device);
  const at::Tensor atom_mask = batch.has_forces.to(device).index_select(0, graph);  // [N]
  const at::Tensor w =
      structure_weights(batch, batch.forces_weight, structure_weight, "ForcesLoss", device, dtype)
          .index_select(0, graph);                                                   // [N]
  const at::Tensor diff = keep(pred.forces - batch.forces.to(device, dtype), atom_mask.unsqueeze(1));
  if (mode_ == ForcesMode::Component) {
    return masked_mean(w.unsqueeze(1) * penalty(diff, kind_, delta_), atom_mask.unsqueeze(1),
                       atom_mask.sum() * 3);
  }
  // Vector: MSE on the squared norm directly (no square root), else ℓ(|ΔF|₂).
  const at::Tensor per_atom = kind_ == LossKind::MSE ? diff.pow(2).sum(1)
                                                     : penalty(safe_row_norm(diff), kind_, delta_);
  return masked_mean(w * per_atom, atom_mask, atom_mask.sum());
}

StressLoss::StressLoss(LossKind kind, double delta) : kind_(kind), delta_(delta) {
  require_delta(kind, delta, "StressLoss");
}

at::Tensor StressLoss::evaluate(const ModelOutputs& pred, const Batch& batch,
                                const at::Tensor& structure_weight) const {
  if (!pred.stress.defined() && !any_labelled(batch.has_stress)) return unlabelled_zero(pred);
  require(pred.stress, "StressLoss", "predicted stress (ComputeOptions::stress)");
  require(batch.stress, "StressLoss", "batch.stress");
  require_same_shape(pred.stress, batch.stress, "StressLoss", "predicted stress");
  const auto dtype = pred.stress.scalar_type();
  const auto device = pred.stress.device();
  const at::Tensor mask = batch.has_stress.to(device).view({-1, 1, 1});  // [B,1,1]
  const at::Tensor w =
      structure_weights(batch, batch.stress_weight, structure_weight, "StressLoss", device, dtype);
  const at::Tensor diff = keep(pred.stress - batch.stress.to(device, dtype), mask);  // [B,3,3]
  return masked_mean(w.view({-1, 1, 1}) * penalty(diff, kind_, delta_), mask, mask.sum() * 9);
}

void WeightedSumLoss::add(std::shared_ptr<LossFunction> term, double weight) {
  if (!term) throw std::invalid_argument("WeightedSumLoss::add: null loss term");
  if (!(weight >= 0.0) || !std::isfinite(weight)) {
    throw std::invalid_argument("WeightedSumLoss::add: weight of '" + term->name() +
                                "' must be a finite number >= 0, got " + num(weight));
  }
  add(std::move(term), std::make_shared<ConstantWeight>(weight));
}

void WeightedSumLoss::add(std::shared_ptr<LossFunction> term,
                          std::shared_ptr<const LossWeightSchedule> schedule) {
  if (!term) throw std::invalid_argument("WeightedSumLoss::add: null loss term");
  if (!schedule) {
    throw std::invalid_argument("WeightedSumLoss::add: null weight schedule for '" + term->name() + "'");
  }
  for (const auto& t : terms_) {
    if (t.fn->name() == term->name()) {
      throw std::invalid_argument("WeightedSumLoss::add: duplicate loss term '" + term->name() + "'");
    }
  }
  terms_.push_back(Term{std::move(term), std::move(schedule)});
}

void WeightedSumLoss::set_progress(int64_t step, int64_t epoch) {
  if (step < 0) throw std::invalid_argument("WeightedSumLoss: step must be >= 0, got " + std::to_string(step));
  if (epoch < 0) {
    throw std::invalid_argument("WeightedSumLoss: epoch must be >= 0, got " + std::to_string(epoch));
  }
  step_ = step;
  epoch_ = epoch;
}

void WeightedSumLoss::set_config_type_weights(std::map<std::string, double> weights) {
  for (const auto& [type, w] : weights) {
    if (!(w >= 0.0) || !std::isfinite(w)) {
      throw std::invalid_argument("WeightedSumLoss: config_type_weights['" + type +
                                  "'] must be a finite number >= 0, got " + num(w));
    }
  }
  config_type_weights_ = std::move(weights);
}

double WeightedSumLoss::weight_of(const Term& term) const {
  const double w = term.schedule->weight(step_, epoch_);
  if (!(w >= 0.0) || !std::isfinite(w)) {
    throw std::invalid_argument("WeightedSumLoss: scheduled weight of '" + term.fn->name() +
                                "' must be a finite number >= 0, got " + num(w) + " at step " +
                                std::to_string(step_) + ", epoch " + std::to_string(epoch_));
  }
  return w;
}

std::map<std::string, double> WeightedSumLoss::current_weights() const {
  std::map<std::string, double> out;
  for (const auto& t : terms_) out[t.fn->name()] = weight_of(t);
  return out;
}

LossOutput WeightedSumLoss::operator()(const ModelOutputs& pred, const Batch& batch) const {
  at::Tensor structure_weight;  // undefined: every config_type weighs 1
  if (!config_type_weights_.empty()) {
    const int64_t B = batch.num_graphs();
    if (static_cast<int64_t>(batch.config_types.size()) != B) {
      throw std::invalid_argument("WeightedSumLoss: batch.config_types must have B = " +
                                  std::to_string(B) + " entries, got " +
                                  std::to_string(batch.config_types.size()));
    }
    std::vector<double> cw(static_cast<size_t>(B), 1.0);
    for (int64_t s = 0; s < B; ++s) {
      const auto it = config_type_weights_.find(batch.config_types[static_cast<size_t>(s)]);
      if (it != config_type_weights_.end()) cw[static_cast<size_t>(s)] = it->second;
    }
    structure_weight = at::tensor(cw, at::kDouble);
  }

  std::vector<double> weights;
  weights.reserve(terms_.size());
  double sum = 0.0;
  for (const auto& t : terms_) {
    weights.push_back(weight_of(t));
    sum += weights.back();
  }
  if (normalize_weights_) {
    for (double& w : weights) w = sum > 0.0 ? w / sum : 0.0;
  }

  LossOutput out;
  for (size_t k = 0; k < terms_.size(); ++k) {
    const auto& term = terms_[k].fn;
    at::Tensor value = term->evaluate(pred, batch, structure_weight);
    out.total = out.total.defined() ? out.total + weights[k] * value : weights[k] * value;
    out.components[term->name()] = value;
    out.weights[term->name()] = weights[k];
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
    if (t.fn->needs_forces()) return true;
  return false;
}

bool WeightedSumLoss::needs_stress() const {
  for (const auto& t : terms_)
    if (t.fn->needs_stress()) return true;
  return false;
}

}  // namespace crucible
