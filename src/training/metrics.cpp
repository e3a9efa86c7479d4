#include "crucible/training/metrics.h"

#include <cmath>
#include <limits>
#include <numeric>

namespace crucible {

namespace {

constexpr double kMilli = 1000.0;  // eV → meV

double mean_or_nan(double sum, int64_t n) {
  return n > 0 ? sum / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
}

/// Restores requires_grad of every parameter on scope exit.
class FreezeParameters {
 public:
  explicit FreezeParameters(torch::nn::Module& module) {
    for (auto& p : module.parameters()) {
      params_.push_back(p);
      flags_.push_back(p.requires_grad());
      p.requires_grad_(false);
    }
  }
  ~FreezeParameters() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].requires_grad_(flags_[i]);
  }
  FreezeParameters(const FreezeParameters&) = delete;
  FreezeParameters& operator=(const FreezeParameters&) = delete;

 private:
  std::vector<at::Tensor> params_;
  std::vector<bool> flags_;
};

}  // namespace

std::map<std::string, double> ValidationSummary::as_map() const {
  return {{"energy_mae", energy_mae},   {"energy_rmse", energy_rmse},
          {"forces_mae", forces_mae},   {"forces_rmse", forces_rmse},
          {"stress_mae", stress_mae},   {"stress_rmse", stress_rmse},
          {"zero_forces_mae", zero_forces_mae}};
}

void MetricsAccumulator::add(const ModelOutputs& pred, const Batch& batch) {
  const auto cpu = at::Device(at::kCPU);
  n_struct_ += batch.num_graphs();
  if (pred.energy.defined()) {
    auto mask = batch.has_energy.to(cpu);
    auto err = (pred.energy.detach().to(cpu, at::kDouble) - batch.energy.to(cpu, at::kDouble)) /
               batch.num_atoms.to(cpu, at::kDouble);
    err = err.masked_select(mask);
    e_abs_ += err.abs().sum().item<double>();
    e_sq_ += err.square().sum().item<double>();
    n_e_ += err.numel();
  }
  if (pred.forces.defined()) {
    auto atom_mask = batch.has_forces.to(cpu).index_select(0, batch.batch.to(cpu));
    auto ref = batch.forces.to(cpu, at::kDouble).index({atom_mask});
    auto err = pred.forces.detach().to(cpu, at::kDouble).index({atom_mask}) - ref;
    f_abs_ += err.abs().sum().item<double>();
    f_sq_ += err.square().sum().item<double>();
    f_zero_ += ref.abs().sum().item<double>();
    n_f_ += err.numel();
  }
  if (pred.stress.defined()) {
    auto mask = batch.has_stress.to(cpu);
    auto err = (pred.stress.detach().to(cpu, at::kDouble) - batch.stress.to(cpu, at::kDouble))
                   .index({mask});
    s_abs_ += err.abs().sum().item<double>();
    s_sq_ += err.square().sum().item<double>();
    n_s_ += err.numel();
  }
}

ValidationSummary MetricsAccumulator::summary() const {
  ValidationSummary s;
  s.energy_mae = kMilli * mean_or_nan(e_abs_, n_e_);
  s.energy_rmse = kMilli * std::sqrt(mean_or_nan(e_sq_, n_e_));
  s.forces_mae = kMilli * mean_or_nan(f_abs_, n_f_);
  s.forces_rmse = kMilli * std::sqrt(mean_or_nan(f_sq_, n_f_));
  s.stress_mae = kMilli * mean_or_nan(s_abs_, n_s_);
  s.stress_rmse = kMilli * std::sqrt(mean_or_nan(s_sq_, n_s_));
  s.zero_forces_mae = kMilli * mean_or_nan(f_zero_, n_f_);
  s.num_energies = n_e_;
  s.num_forces = n_f_;
  s.num_stresses = n_s_;
  s.num_structures = n_struct_;
  return s;
}

ValidationSummary evaluate_model(EnergyModel& model, const AtomicDataset& dataset,
                                 at::Device device, const EvaluateOptions& options) {
  torch::nn::Module& module = model.module();
  const bool was_training = module.is_training();
  module.train(false);
  FreezeParameters frozen(module);
  MetricsAccumulator acc;
  const int64_t n = dataset.size();
  const int64_t bs = std::max<int64_t>(1, options.batch_size);
  for (int64_t begin = 0; begin < n; begin += bs) {
    std::vector<int64_t> idx(std::min(bs, n - begin));
    std::iota(idx.begin(), idx.end(), begin);
    Batch batch = dataset.collate(idx).to(device, options.dtype);
    ComputeOptions co;
    co.forces = true;
    co.stress = options.stress && batch.has_stress.any().item<bool>();
    co.training = false;
    acc.add(compute_outputs(model, batch, co), batch);
  }
  module.train(was_training);
  return acc.summary();
}

}  // namespace crucible
