#pragma once
// Learning-rate schedulers with torch.optim.lr_scheduler's meaning (LibTorch
// 1.13 has only StepLR): per-step schedules stepped by the strategy or the
// update orchestrator after every optimizer step that ran (seed 001), and
// ReduceLROnPlateau, stepped with a validation metric after validation
// (seed 002 `_step_metric_schedulers`).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace crucible {

/// A learning-rate scheduler bound to one optimizer (PyTorch LRScheduler).
///
/// Clock: `last_step()` counts step() calls (PyTorch's `last_epoch`; the
/// strategy calls step() once per optimizer step that ran, so it is the
/// optimizer-step count). Construction records every param group's current
/// lr as its base lr and sets the lr of step 0. Not thread-safe.
class LrScheduler {
 public:
  /// @throws std::invalid_argument if the optimizer has no param group.
  explicit LrScheduler(torch::optim::Optimizer& optimizer);
  virtual ~LrScheduler() = default;
  LrScheduler(const LrScheduler&) = delete;
  LrScheduler& operator=(const LrScheduler&) = delete;

  /// Short name ("cosine", "plateau", ...), for messages.
  virtual std::string name() const = 0;
  /// True for schedulers driven by a validation metric (ReduceLROnPlateau):
  /// those are stepped with step(metric) after validation, never per step.
  virtual bool metric_driven() const { return false; }
  /// The validation metric a metric-driven scheduler reads, e.g.
  /// "forces_mae" (a ValidationSummary::as_map() key); "" for the others.
  virtual std::string monitor() const { return ""; }

  /// Advances the per-step clock by one and sets every group's lr.
  /// @throws std::logic_error for a metric-driven scheduler.
  virtual void step();
  /// Metric-driven step with the monitored value.
  /// @throws std::logic_error for a per-step scheduler.
  virtual void step(double metric);

  /// step() calls so far.
  int64_t last_step() const { return last_step_; }
  /// Learning rate of each param group now.
  std::vector<double> last_lr() const;
  /// Base learning rate of each param group (its lr at construction).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

  /// Holds every group's lr at `lr` from now on (MACE's stage two, SWALR
  /// with one anneal epoch: the lr jumps to swa_lr and stays): step() and
  /// step(metric) still count, but no longer change the lr, and a plateau
  /// scheduler stops watching its metric. Idempotent; recorded by
  /// state_dict() ("held_lr"), so a resumed run keeps it.
  /// @throws std::invalid_argument if lr is not finite and > 0.
  void hold(double lr);
  /// The held lr, if hold() was called.
  std::optional<double> held_lr() const { return held_lr_; }

  /// Counters and base lrs by name (all values as double), for checkpoints.
  virtual std::map<std::string, double> state_dict() const;
  /// Restores a state_dict() of a scheduler of the same kind and applies
  /// the lr of the restored step.
  /// @throws std::invalid_argument naming a missing key or a base-lr count
  ///   that differs from the optimizer's param groups.
  virtual void load_state_dict(const std::map<std::string, double>& state);

 protected:
  /// lr of a group with base lr `base_lr` after `step` step() calls.
  virtual double lr_at(int64_t step, double base_lr) const = 0;
  /// Sets every group's lr to lr_at(last_step(), base).
  void apply();
  void set_lr(size_t group, double lr);

  torch::optim::Optimizer* optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_step_ = 0;
  std::optional<double> held_lr_;
};

/// Linear warmup in front of a per-step schedule (PyTorch SequentialLR of
/// LinearLR(start_factor, 1, W) and the main schedule, milestone W):
///   lr(s) = base · (f0 + (1 − f0) · s / W)   for s < W,
///   lr(s) = main(s − W)                     for s ≥ W.
struct WarmupOptions {
  int64_t steps = 0;           ///< W, >= 0; 0 = no warmup. Default 0.
  double start_factor = 0.0;   ///< f0 in [0, 1]. Default 0 (PyTorch LinearLR: 1/3).
};

/// Constant lr after the warmup (PyTorch ConstantLR with factor 1).
class ConstantLr : public LrScheduler {
 public:
  /// @throws ConfigError for bad warmup options (named).
  ConstantLr(torch::optim::Optimizer& optimizer, WarmupOptions warmup = {});
  std::string name() const override { return "constant"; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;
  WarmupOptions warmup_;
};

/// PyTorch StepLR: lr = base · gamma^floor(s / step_size) (after warmup).
class StepLr : public ConstantLr {
 public:
  /// @throws ConfigError if step_size < 1 or gamma not in (0, 1].
  StepLr(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma,
         WarmupOptions warmup = {});
  std::string name() const override { return "step"; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// PyTorch ExponentialLR: lr = base · gamma^s (after warmup).
class ExponentialLr : public ConstantLr {
 public:
  /// @throws ConfigError if gamma not in (0, 1].
  ExponentialLr(torch::optim::Optimizer& optimizer, double gamma, WarmupOptions warmup = {});
  std::string name() const override { return "exponential"; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  double gamma_;
};

/// PyTorch CosineAnnealingLR (closed form, SGDR without restarts; Loshchilov
/// & Hutter, arXiv:1608.03983, eq. 5) with eta_min = base · final_factor:
///   lr(s) = eta_min + ½ (base − eta_min)(1 + cos(π s / T_max))
/// counted from the end of the warmup. Past T_max the lr stays at eta_min
/// (PyTorch would rise again; a run never wants that).
class CosineAnnealingLr : public ConstantLr {
 public:
  /// @throws ConfigError if t_max < 1 or final_factor not in [0, 1].
  CosineAnnealingLr(torch::optim::Optimizer& optimizer, int64_t t_max, double final_factor,
                    WarmupOptions warmup = {});
  std::string name() const override { return "cosine"; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t t_max_;
  double final_factor_;
};

/// Options of ReduceLrOnPlateau (PyTorch's defaults, mode "min",
/// threshold_mode "rel").
struct PlateauOptions {
  std::string monitor = "forces_mae";  ///< ValidationSummary::as_map() key.
  double factor = 0.1;     ///< lr multiplier on a plateau, in (0, 1).
  int64_t patience = 10;   ///< validations without improvement tolerated, >= 0.
  double threshold = 1e-4; ///< relative improvement that counts, >= 0.
  int64_t cooldown = 0;    ///< validations to wait after a reduction, >= 0.
  double min_lr = 0.0;     ///< lower bound of the lr, >= 0.
  double eps = 1e-8;       ///< reductions smaller than this are ignored, >= 0.
};

/// PyTorch ReduceLROnPlateau (mode "min", threshold_mode "rel"): after each
/// step(metric), a metric below best · (1 − threshold) is an improvement;
/// after more than `patience` validations without one, every group's lr
/// becomes max(lr · factor, min_lr) (if that changes it by more than eps),
/// then `cooldown` validations are not counted. Metric-driven: never
/// stepped per optimizer step. A NaN metric counts as no improvement.
class ReduceLrOnPlateau : public LrScheduler {
 public:
  /// @throws ConfigError naming an option outside its range or an
  ///   empty monitor.
  ReduceLrOnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options = {});
  std::string name() const override { return "plateau"; }
  bool metric_driven() const override { return true; }
  std::string monitor() const override { return options_.monitor; }
  using LrScheduler::step;
  void step(double metric) override;
  std::map<std::string, double> state_dict() const override;
  void load_state_dict(const std::map<std::string, double>& state) override;
  /// Best metric so far (+inf before the first step).
  double best() const { return best_; }
  /// Validations since the last improvement.
  int64_t num_bad_steps() const { return num_bad_; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  PlateauOptions options_;
  double best_;
  int64_t num_bad_ = 0;
  int64_t cooldown_counter_ = 0;
};

/// Steps, after an optimizer step, the per-step scheduler of every
/// optimizer whose step ran (seed 001 `_step_optimizers_with_context`):
/// schedulers[i] belongs to optimizer i; it is skipped when null, when
/// metric-driven, or when skipped[i] is true (e.g. the gradient scaler found
/// inf/NaN in that optimizer's gradients). `skipped` may be empty (= none
/// skipped). @throws std::invalid_argument if `skipped` is non-empty and
/// shorter than `schedulers`.
void step_lr_schedulers(const std::vector<LrScheduler*>& schedulers,
                        const std::vector<bool>& skipped = {});

/// A scheduler by name, with every option (the ones a name does not use
/// are ignored by it; the config layer rejects them).
struct SchedulerConfig {
  /// "constant", "cosine", "step", "exponential" or "plateau". Default "constant".
  std::string name = "constant";
  double final_lr_factor = 0.01;  ///< cosine: final lr / base lr.
  int64_t t_max = 0;              ///< cosine: steps of the anneal; 0 = the run's steps − warmup.
  int64_t step_size = 1;          ///< step: steps between decays.
  double gamma = 0.1;             ///< step / exponential: decay factor.
  WarmupOptions warmup;           ///< per-step schedules only.
  PlateauOptions plateau;         ///< plateau only.
};

/// Checks `config` without an optimizer (builds it on a throwaway one).
/// @throws ConfigError "<path>: <what>" as make_lr_scheduler would.
void check_scheduler_config(const SchedulerConfig& config, const std::string& path);

/// Builds the scheduler `config` names for `optimizer`; `total_steps` is the
/// run's optimizer-step target (used for the cosine T_max when 0).
/// @throws ConfigError for an unknown name (listing the known
///   ones), options outside their range, or a warmup with "plateau".
std::unique_ptr<LrScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                               torch::optim::Optimizer& optimizer,
                                               int64_t total_steps);

}  // namespace crucible
