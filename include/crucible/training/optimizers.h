#pragma once
// Optimizers by name with PyTorch's options and defaults, parameter groups
// chosen by name pattern, and one optional LR scheduler each (seed 002
// OptimizerConfig; issue 4 deliverable 1).

#include "crucible/training/lr_scheduler.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace crucible {

struct ValidationSummary;  // crucible/training/metrics.h

/// A parameter group: the parameters whose name matches `pattern` (ECMAScript
/// regex, searched anywhere in the name, e.g. "embedding" or "bias$") get
/// `options` instead of the optimizer's. Each parameter joins the first
/// group that matches; the rest form the default group.
struct ParamGroupConfig {
  std::string pattern;
  /// Option name (as OptimizerConfig's fields: lr, weight_decay, momentum,
  /// ...) → value; only options of the group's optimizer are accepted.
  std::map<std::string, double> options;
};

/// One optimizer: name, PyTorch options, which parameters, groups, scheduler.
///
/// Options left unset take the optimizer's PyTorch default; options the
/// named optimizer does not have must stay unset (check_optimizer_config).
///  - adam / adamw: lr 1e-3, betas (beta1 0.9, beta2 0.999), eps 1e-8,
///    weight_decay 0 (adamw: 1e-2, decoupled; Loshchilov & Hutter 2019), amsgrad.
///  - sgd: lr (required), momentum 0, dampening 0, weight_decay 0, nesterov
///    (needs momentum > 0 and dampening 0).
///  - rmsprop: lr 1e-2, alpha 0.99, eps 1e-8, weight_decay 0, momentum 0, centered.
///  - adagrad: lr 1e-2, lr_decay 0, weight_decay 0,
///    initial_accumulator_value 0, eps 1e-10.
struct OptimizerConfig {
  std::string name = "adam";  ///< adam, adamw, sgd, rmsprop, adagrad.
  std::optional<double> lr;            ///< > 0.
  std::optional<double> weight_decay;  ///< >= 0.
  std::optional<double> eps;           ///< > 0 (adam, adamw, rmsprop, adagrad).
  std::optional<double> beta1;         ///< [0, 1) (adam, adamw).
  std::optional<double> beta2;         ///< [0, 1) (adam, adamw).
  std::optional<bool> amsgrad;         ///< adam, adamw.
  std::optional<double> momentum;      ///< >= 0 (sgd, rmsprop).
  std::optional<double> dampening;     ///< sgd.
  std::optional<bool> nesterov;        ///< sgd.
  std::optional<double> alpha;         ///< [0, 1) (rmsprop smoothing constant).
  std::optional<bool> centered;        ///< rmsprop.
  std::optional<double> lr_decay;      ///< >= 0 (adagrad).
  std::optional<double> initial_accumulator_value;  ///< >= 0 (adagrad).
  /// Which of the model's trainable parameters this optimizer takes (regex
  /// searched in the parameter name); "" = all not taken by an earlier
  /// optimizer of the same model. Default "".
  std::string params;
  std::vector<ParamGroupConfig> param_groups;
  /// This optimizer's scheduler; none = constant lr. Checked by
  /// check_scheduler_config.
  std::optional<SchedulerConfig> scheduler;
  /// Seed 002 scheduler_metric_adapter as a callable: the value a
  /// metric-driven scheduler (plateau) of this optimizer steps on, computed
  /// from each validation summary. Unset = the scheduler's monitor key
  /// (PlateauOptions::monitor). A strategy spec cannot hold a callable:
  /// TrainingStrategy::to_spec refuses one (ConfigError).
  std::function<double(const ValidationSummary&)> scheduler_metric;
};

/// The optimizer names check_optimizer_config accepts, in documentation order.
const std::vector<std::string>& optimizer_names();

/// Option names (OptimizerConfig field names) the optimizer `name` has.
/// @throws ConfigError for an unknown name (listing the known ones).
const std::vector<std::string>& optimizer_option_names(const std::string& name);

/// Checks `config` before anything is built: known name, options the
/// optimizer has, values in range, valid patterns, group options known to
/// the optimizer and in range (not the scheduler: check_scheduler_config). `path` prefixes
/// every message (e.g. "optimizer_configs.main[0]").
/// @throws ConfigError "<path>.<option> ..." naming the option and what was expected.
void check_optimizer_config(const OptimizerConfig& config, const std::string& path);

/// Builds the optimizer over `named_params` (name → parameter, in model
/// order; parameters the caller already filtered), split into param groups
/// by `config.param_groups` (first match wins; the default group last,
/// omitted when empty).
/// @throws ConfigError if `named_params` is empty or a group pattern matches
///   no parameter (a likely typo), naming `path`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const OptimizerConfig& config,
    const std::vector<std::pair<std::string, at::Tensor>>& named_params, const std::string& path);

}  // namespace crucible
