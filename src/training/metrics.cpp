#include "crucible/training/metrics.h"

#include "crucible/losses/loss.h"
#include "crucible/precision/precision.h"

#include <algorithm>

#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

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

std::map<std::string, double> ErrorMetrics::as_map() const {
  return {{"energy_mae", energy_mae},   {"energy_rmse", energy_rmse},
          {"forces_mae", forces_mae},   {"forces_rmse", forces_rmse},
          {"stress_mae", stress_mae},   {"stress_rmse", stress_rmse},
          {"zero_forces_mae", zero_forces_mae}};
}

std::vector<std::string> validation_monitor_names() {
  std::vector<std::string> out{"loss"};
  for (const auto& [k, v] : ErrorMetrics{}.as_map()) {
    if (k != "zero_forces_mae") out.push_back(k);
  }
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) out.push_back("val/" + out[i]);
  return out;
}

double validation_monitor_value(const ValidationSummary& summary, const std::string& monitor) {
  const std::string key = monitor.rfind("val/", 0) == 0 ? monitor.substr(4) : monitor;
  if (key == "loss") return summary.loss;
  const auto names = validation_monitor_names();
  if (std::find(names.begin(), names.end(), key) == names.end()) {
    std::string known;
    for (size_t i = 0; i < names.size() / 2; ++i) known += (i ? ", " : "") + names[i];
    throw std::invalid_argument("must be a validation monitor (" + known +
                                "), optionally prefixed with val/, got '" + monitor + "'");
  }
  return summary.as_map().at(key);
}

void MetricsAccumulator::add(const ModelOutputs& pred, const Batch& batch) {
  const auto cpu = at::Device(at::kCPU);
  const int64_t b = batch.num_graphs();
  if (static_cast<int64_t>(batch.config_types.size()) != b) {
    throw std::invalid_argument("batch.config_types must have one entry per structure (" +
                                std::to_string(b) + "), got " +
                                std::to_string(batch.config_types.size()));
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // Per-structure sums [B]; totals and config_type groups add them up.
  at::Tensor e_abs = at::zeros({b}, f64), e_sq = at::zeros({b}, f64), e_n = at::zeros({b}, f64);
  at::Tensor e_ref = at::zeros({b}, f64);  // E_ref / N where labelled
  at::Tensor f_abs = at::zeros({b}, f64), f_sq = at::zeros({b}, f64), f_zero = at::zeros({b}, f64),
             f_n = at::zeros({b}, f64);
  at::Tensor s_abs = at::zeros({b}, f64), s_sq = at::zeros({b}, f64), s_n = at::zeros({b}, f64);
  if (pred.energy.defined()) {
    const auto mask = batch.has_energy.to(cpu);
    auto err = (pred.energy.detach().to(cpu, at::kDouble) - batch.energy.to(cpu, at::kDouble)) /
               batch.num_atoms.to(cpu, at::kDouble);
    err = at::where(mask, err, at::zeros_like(err));  // a NaN on an unlabelled item stays out
    const auto ref = batch.energy.to(cpu, at::kDouble) / batch.num_atoms.to(cpu, at::kDouble);
    e_ref = at::where(mask, ref, at::zeros_like(ref));
    e_abs = err.abs();
    e_sq = err.square();
    e_n = mask.to(at::kDouble);
  }
  const at::Tensor atom_graph = batch.batch.to(cpu);
  if (pred.forces.defined()) {
    const auto atom_mask = batch.has_forces.to(cpu).index_select(0, atom_graph).unsqueeze(1);
    const auto ref = at::where(atom_mask, batch.forces.to(cpu, at::kDouble),
                               at::zeros({1}, f64));
    const auto err = at::where(atom_mask, pred.forces.detach().to(cpu, at::kDouble) - ref,
                               at::zeros({1}, f64));
    f_abs = f_abs.index_add(0, atom_graph, err.abs().sum(1));
    f_sq = f_sq.index_add(0, atom_graph, err.square().sum(1));
    f_zero = f_zero.index_add(0, atom_graph, ref.abs().sum(1));
    f_n = f_n.index_add(0, atom_graph, 3.0 * atom_mask.squeeze(1).to(at::kDouble));
  }
  if (pred.stress.defined()) {
    const auto mask = batch.has_stress.to(cpu).view({b, 1, 1});
    const auto err = at::where(mask,
                               pred.stress.detach().to(cpu, at::kDouble) -
                                   batch.stress.to(cpu, at::kDouble),
                               at::zeros({1}, f64));
    s_abs = err.abs().sum({1, 2});
    s_sq = err.square().sum({1, 2});
    s_n = 9.0 * mask.view({b}).to(at::kDouble);
  }
  auto ea = e_abs.accessor<double, 1>(), es = e_sq.accessor<double, 1>(),
       en = e_n.accessor<double, 1>(), fa = f_abs.accessor<double, 1>(),
       fs = f_sq.accessor<double, 1>(), fz = f_zero.accessor<double, 1>(),
       fn = f_n.accessor<double, 1>(), sa = s_abs.accessor<double, 1>(),
       ss = s_sq.accessor<double, 1>(), sn = s_n.accessor<double, 1>(), er = e_ref.accessor<double, 1>();
  for (int64_t i = 0; i < b; ++i) {
    for (Sums* sums : {&total_, &by_type_[batch.config_types[i]]}) {
      sums->e_abs += ea[i];
      sums->e_sq += es[i];
      sums->e_ref += er[i];
      sums->e_ref_sq += er[i] * er[i];
      sums->n_e += static_cast<int64_t>(en[i]);
      sums->f_abs += fa[i];
      sums->f_sq += fs[i];
      sums->f_zero += fz[i];
      sums->n_f += static_cast<int64_t>(fn[i]);
      sums->s_abs += sa[i];
      sums->s_sq += ss[i];
      sums->n_s += static_cast<int64_t>(sn[i]);
      sums->n_struct += 1;
    }
  }
}

ErrorMetrics MetricsAccumulator::Sums::metrics() const {
  ErrorMetrics s;
  s.energy_mae = kMilli * mean_or_nan(e_abs, n_e);
  s.energy_rmse = kMilli * std::sqrt(mean_or_nan(e_sq, n_e));
  s.forces_mae = kMilli * mean_or_nan(f_abs, n_f);
  s.forces_rmse = kMilli * std::sqrt(mean_or_nan(f_sq, n_f));
  s.stress_mae = kMilli * mean_or_nan(s_abs, n_s);
  s.stress_rmse = kMilli * std::sqrt(mean_or_nan(s_sq, n_s));
  s.zero_forces_mae = kMilli * mean_or_nan(f_zero, n_f);
  {
    const double mean = mean_or_nan(e_ref, n_e);
    s.mean_energy_rmse = kMilli * std::sqrt(std::max(0.0, mean_or_nan(e_ref_sq, n_e) - mean * mean));
  }
  s.num_energies = n_e;
  s.num_forces = n_f;
  s.num_stresses = n_s;
  s.num_structures = n_struct;
  return s;
}

void MetricsAccumulator::allreduce(Communicator& communicator,
                                   const std::vector<std::string>& config_types) {
  for (const auto& [type, sums] : by_type_) {
    (void)sums;
    if (std::find(config_types.begin(), config_types.end(), type) == config_types.end()) {
      throw std::invalid_argument("MetricsAccumulator::allreduce: config_type '" + type +
                                  "' must be in the list of all types, got no such entry");
    }
  }
  constexpr int64_t kFields = 13;
  const int64_t rows = 1 + static_cast<int64_t>(config_types.size());
  at::Tensor packed = at::zeros({rows, kFields}, at::kDouble);
  auto pack = [&](int64_t row, const Sums& x) {
    double* d = packed.data_ptr<double>() + row * kFields;
    const double v[kFields] = {x.e_abs, x.e_sq, x.f_abs, x.f_sq, x.s_abs, x.s_sq, x.f_zero,
                               double(x.n_e), double(x.n_f), double(x.n_s), double(x.n_struct), x.e_ref,
                               x.e_ref_sq};
    std::copy(v, v + kFields, d);
  };
  pack(0, total_);
  for (size_t t = 0; t < config_types.size(); ++t) {
    auto it = by_type_.find(config_types[t]);
    if (it != by_type_.end()) pack(1 + static_cast<int64_t>(t), it->second);
  }
  communicator.allreduce_sum(packed);
  auto unpack = [&](int64_t row) {
    const double* d = packed.data_ptr<double>() + row * kFields;
    Sums x;
    x.e_abs = d[0], x.e_sq = d[1], x.f_abs = d[2], x.f_sq = d[3], x.s_abs = d[4], x.s_sq = d[5];
    x.f_zero = d[6];
    x.n_e = std::llround(d[7]), x.n_f = std::llround(d[8]), x.n_s = std::llround(d[9]);
    x.n_struct = std::llround(d[10]);
    x.e_ref = d[11], x.e_ref_sq = d[12];
    return x;
  };
  total_ = unpack(0);
  by_type_.clear();
  for (size_t t = 0; t < config_types.size(); ++t) {
    Sums x = unpack(1 + static_cast<int64_t>(t));
    if (x.n_struct > 0) by_type_[config_types[t]] = x;
  }
}

ValidationSummary MetricsAccumulator::summary() const {
  ValidationSummary s;
  static_cast<ErrorMetrics&>(s) = total_.metrics();
  for (const auto& [type, sums] : by_type_) s.per_config_type[type] = sums.metrics();
  return s;
}

ValidationSummary evaluate_model(EnergyModel& model, const AtomicDataset& dataset,
                                 at::Device device, const EvaluateOptions& options) {
  torch::nn::Module& module = model.module();
  const bool was_training = module.is_training();
  module.train(false);
  FreezeParameters frozen(module);
  MetricsAccumulator acc;
  std::map<std::string, double> loss_sums;  // "total", "component.<name>": Σ_batches B · L
  double loss_weight = 0.0;                 // Σ_batches B
  // This worker's structures: all, or every size-th from rank (data parallel).
  Communicator* comm = options.communicator;
  const bool sharded = comm && comm->size() > 1;
  std::vector<int64_t> mine;
  for (int64_t i = sharded ? comm->rank() : 0; i < dataset.size(); i += sharded ? comm->size() : 1) {
    mine.push_back(i);
  }
  const int64_t n = static_cast<int64_t>(mine.size());
  const int64_t bs = std::max<int64_t>(1, options.batch_size);
  for (int64_t begin = 0; begin < n; begin += bs) {
    std::vector<int64_t> idx(mine.begin() + begin, mine.begin() + std::min(n, begin + bs));
    Batch batch = options.precision
                      ? keep_geometry_float32(options.precision->convert_input(dataset.collate(idx), device))
                      : dataset.collate(idx).to(device, options.dtype);
    ComputeOptions co;
    co.forces = true;
    co.stress = options.stress && batch.has_stress.any().item<bool>();
    co.training = false;
    ModelOutputs out = compute_outputs(model, batch, co);
    if (options.precision) out = options.precision->convert_output(out);
    acc.add(out, batch);
    if (options.loss) {
      at::NoGradGuard no_grad;
      const LossOutput lo = (*options.loss)(out, batch);
      const double w = static_cast<double>(batch.num_graphs());
      loss_sums["total"] += w * lo.total.item<double>();
      for (const auto& [k, v] : lo.components) loss_sums["component." + k] += w * v.item<double>();
      loss_weight += w;
    }
  }
  module.train(was_training);
  if (sharded) {
    std::vector<std::string> types;
    for (const auto& st : dataset.structures()) {
      if (std::find(types.begin(), types.end(), st.config_type) == types.end()) types.push_back(st.config_type);
    }
    std::sort(types.begin(), types.end());
    acc.allreduce(*comm, types);
    if (options.loss) {
      // Every worker has the same terms (one loss): one float64 all-reduce.
      std::vector<std::string> keys{"total"};
      for (const auto& [k, w] : options.loss->current_weights()) keys.push_back("component." + k);
      std::vector<double> values{loss_weight};
      for (const auto& k : keys) values.push_back(loss_sums[k]);
      at::Tensor t = at::tensor(values, at::kDouble);
      comm->allreduce_sum(t);
      loss_weight = t[0].item<double>();
      for (size_t i = 0; i < keys.size(); ++i) loss_sums[keys[i]] = t[static_cast<int64_t>(i) + 1].item<double>();
    }
  }
  ValidationSummary summary = acc.summary();
  if (options.loss && loss_weight > 0) {
    for (const auto& [k, v] : loss_sums) {
      if (k == "total") {
        summary.loss = v / loss_weight;
      } else {
        summary.loss_components[k.substr(10)] = v / loss_weight;
      }
    }
  }
  return summary;
}

}  // namespace crucible
