// Distillation with named models (seed 002, issue 4): a small SchNet student
// learns the energies and forces of a frozen SchNet teacher on the bundled
// TiAl structures. The strategy gets {"student", "teacher"}; only the student
// has an optimizer config, so the teacher is put in eval mode with
// requires_grad false for the run and restored after it.
//
//   ./build/examples/example_distill                      # teacher trained here first
//   ./build/examples/example_distill --teacher runs/default  # the README run's model
//
// Prints the student's energy / force MAE against the teacher and against
// DFT on held-out structures, before and after distillation.

#include "crucible/run/model_io.h"
#include "crucible/config/config.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/losses/loss.h"
#include "crucible/models/schnet.h"
#include "crucible/training/metrics.h"
#include "crucible/training/strategy.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace crucible;

/// The teacher's predictions for the current batch, written by the training
/// function and read by the loss (a distillation target instead of the labels).
struct TeacherOutputs {
  at::Tensor energy;  ///< [B] eV
  at::Tensor forces;  ///< [N,3] eV/Å
};

/// MSE between the student and the teacher: energy per atom (eV²/atom²) +
/// `forces_weight` × force components (eV²/Å²).
class DistillationLoss : public LossFunction {
 public:
  DistillationLoss(std::shared_ptr<TeacherOutputs> teacher, std::string name, bool forces)
      : teacher_(std::move(teacher)), name_(std::move(name)), forces_(forces) {}
  at::Tensor evaluate(const ModelOutputs& pred, const Batch& batch,
                      const at::Tensor& /*structure_weight*/) const override {
    if (forces_) return (pred.forces - teacher_->forces).square().mean();
    const at::Tensor n = batch.num_atoms.to(pred.energy.scalar_type());
    return ((pred.energy - teacher_->energy) / n).square().mean();
  }
  std::string name() const override { return name_; }
  bool needs_forces() const override { return forces_; }

 private:
  std::shared_ptr<TeacherOutputs> teacher_;
  std::string name_;
  bool forces_;
};

/// Energy / force MAE (meV/atom, meV/Å) of `student` against `reference`.
std::pair<double, double> mae_against(EnergyModel& student, EnergyModel& reference,
                                      const AtomicDataset& data) {
  MetricsAccumulator acc;
  std::vector<int64_t> idx(data.size());
  std::iota(idx.begin(), idx.end(), 0);
  Batch batch = data.collate(idx).to(at::kCPU, at::kFloat);
  ComputeOptions co;
  ModelOutputs ref = compute_outputs(reference, batch, co);
  batch.energy = ref.energy.detach();
  batch.forces = ref.forces.detach();
  batch.has_energy.fill_(true);
  batch.has_forces.fill_(true);
  acc.add(compute_outputs(student, batch, co), batch);
  const auto s = acc.summary();
  return {s.energy_mae, s.forces_mae};
}

SchNet make_schnet(const SchNetOptions& so, const std::vector<Structure>& train) {
  SchNet m(so);
  const at::Tensor e0 = fit_reference_energies(train);
  const auto [scale, shift] = fit_energy_scale_shift(train, e0);
  m->set_energy_normalization(e0, scale, shift);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Distil a small SchNet student from a frozen SchNet teacher (TiAl data)."};
  std::string teacher_dir;
  int64_t teacher_epochs = 5, epochs = 10, frames = 0;
  app.add_option("--teacher", teacher_dir, "Run directory of a trained teacher (crucible train)");
  app.add_option("--teacher-epochs", teacher_epochs, "Epochs to train a teacher when none is given")
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs, "Distillation epochs")->check(CLI::PositiveNumber);
  app.add_option("--frames", frames, "Use only the first N structures (0 = all)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    at::manual_seed(0);
    auto all = read_extxyz(CRUCIBLE_SOURCE_DIR "/data/alloy_TiAl/TiAl_tutorial.xyz");
    if (frames > 0 && frames < static_cast<int64_t>(all.size())) all.resize(frames);
    const auto [train_idx, valid_idx] = random_split(static_cast<int64_t>(all.size()), 0.1, 1);
    std::vector<Structure> train, valid;
    for (int64_t i : train_idx) train.push_back(all[i]);
    for (int64_t i : valid_idx) valid.push_back(all[i]);
    const double cutoff = 5.0;
    auto train_ds = std::make_shared<AtomicDataset>(train, cutoff);
    auto valid_ds = std::make_shared<AtomicDataset>(valid, cutoff);

    // ---- the teacher: loaded, or trained here on the DFT labels.
    std::shared_ptr<EnergyModel> teacher;
    if (!teacher_dir.empty()) {
      teacher = load_model(teacher_dir).model;  // any registered model type
      teacher->module().to(at::kFloat);
    } else {
      // The default model: SchNet with the default model.schnet.* keys.
      const ModelConfig mc = default_config().model;
      SchNetOptions to;
      to.hidden_channels = std::get<int64_t>(mc.params.at("schnet.hidden_channels"));
      to.num_filters = std::get<int64_t>(mc.params.at("schnet.num_filters"));
      to.num_interactions = std::get<int64_t>(mc.params.at("schnet.num_interactions"));
      to.num_gaussians = std::get<int64_t>(mc.params.at("schnet.num_gaussians"));
      to.cutoff = mc.cutoff;
      teacher = make_schnet(to, train).ptr();
      StrategyOptions so;
      so.num_epochs = teacher_epochs;
      so.dtype = at::kFloat;
      so.optimizer.lr = 5e-3;
      WeightedSumLoss loss;
      loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
      loss.add(std::make_shared<ForcesMSELoss>(), 1.0);
      TrainingStrategy teach(teacher, so, loss);
      DataLoader loader(train_ds, DataLoaderOptions{4, true, 0, false});
      teach.run(loader);
      std::printf("teacher: %lld epochs of training on %zu structures\n",
                  static_cast<long long>(teacher_epochs), train.size());
    }

    // ---- the student: a quarter of the width, one interaction.
    SchNetOptions so_student;
    so_student.hidden_channels = 8;
    so_student.num_filters = 8;
    so_student.num_interactions = 1;
    so_student.cutoff = cutoff;
    SchNet student = make_schnet(so_student, train);
    student->to(at::kFloat);

    auto target = std::make_shared<TeacherOutputs>();
    WeightedSumLoss loss;
    loss.add(std::make_shared<DistillationLoss>(target, "energy", false), 1.0);
    loss.add(std::make_shared<DistillationLoss>(target, "forces", true), 1.0);
    // The training function sees every model by name: the frozen teacher
    // labels the batch, the student predicts it (with a graph for training).
    NamedTrainingFn fn = [target](const std::map<std::string, EnergyModel*>& models,
                                  const Batch& batch) {
      ComputeOptions teacher_co;  // forces need autograd w.r.t. positions, no graph kept
      ModelOutputs t = compute_outputs(*models.at("teacher"), batch, teacher_co);
      target->energy = t.energy.detach();
      target->forces = t.forces.detach();
      ComputeOptions co;
      co.training = true;
      return compute_outputs(*models.at("student"), batch, co);
    };
    StrategyOptions so;
    so.num_epochs = epochs;
    so.dtype = at::kFloat;
    OptimizerConfig adam;
    adam.lr = 1e-2;
    SchedulerConfig cosine;
    cosine.name = "cosine";
    cosine.final_lr_factor = 0.05;
    adam.scheduler = cosine;
    so.optimizer_configs["student"] = {adam};  // no entry for the teacher: frozen
    TrainingStrategy distill({{"student", student.ptr()}, {"teacher", teacher}}, so, loss,
                             {}, fn);

    const auto before = mae_against(*student, *teacher, *valid_ds);
    DataLoader loader(train_ds, DataLoaderOptions{4, true, 0, false});
    distill.run(loader);
    const auto after = mae_against(*student, *teacher, *valid_ds);
    EvaluateOptions eo;
    eo.dtype = at::kFloat;
    const auto dft_student = evaluate_model(*student, *valid_ds, at::kCPU, eo);
    const auto dft_teacher = evaluate_model(*teacher, *valid_ds, at::kCPU, eo);
    bool teacher_frozen_flags_restored = true;
    for (const auto& p : teacher->module().parameters()) {
      teacher_frozen_flags_restored = teacher_frozen_flags_restored && p.requires_grad();
    }

    auto count = [](const std::vector<at::Tensor>& params) {
      int64_t n = 0;
      for (const auto& p : params) n += p.numel();
      return static_cast<long long>(n);
    };
    std::printf("distillation: %lld epochs, %lld steps; student %lld parameters, teacher %lld\n",
                static_cast<long long>(epochs), static_cast<long long>(distill.step_count),
                count(student->parameters()), count(teacher->module().parameters()));
    std::printf("student vs teacher on %zu held-out structures: energy MAE %.2f -> %.2f "
                "meV/atom, force MAE %.1f -> %.1f meV/A\n",
                valid.size(), before.first, after.first, before.second, after.second);
    std::printf("against DFT: student energy MAE %.2f meV/atom, force MAE %.1f meV/A; teacher "
                "%.2f meV/atom, %.1f meV/A\n",
                dft_student.energy_mae, dft_student.forces_mae, dft_teacher.energy_mae,
                dft_teacher.forces_mae);
    std::printf("teacher requires_grad restored after the run: %s\n",
                teacher_frozen_flags_restored ? "yes" : "no");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_distill: error: %s\n", e.what());
    return 1;
  }
}
