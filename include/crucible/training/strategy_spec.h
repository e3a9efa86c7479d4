#pragma once
// The declarative part of a TrainingStrategy as JSON (seed 002 to_spec_dict /
// from_spec_dict): durations, optimizers with their schedulers, validation
// cadence, precision mode, non-finite policy, data-parallel bucket size.
// Runtime pieces (models, loss, hooks, training function, validation data,
// communicator, a precision plugin object, the device) are not in the spec:
// the caller passes them again, as seed 002's from_spec_dict does.

#include "crucible/training/strategy.h"

#include <string>

namespace crucible {

/// Version of the spec layout written under "spec_version".
inline constexpr int kStrategySpecVersion = 1;

/// `options` as JSON text (2-space indented):
/// {"spec_version": 1, "num_epochs": n | null, "num_steps": n | null,
///  "epoch_step_modifier": x, "optimizer": {...}, "optimizer_configs":
///  {"<model>": [{...}, ...]}, "dtype": "float32" | "float64" | ...,
///  "precision": "" | mode, "precision_plugin": bool (a plugin object was
///  set; it is runtime), "validation": null | {"every_n_epochs",
///  "every_n_steps", "batch_size", "use_ema", "use_mixed_precision",
///  "compute_loss"}, "stop_on_non_finite", "max_batches_without_step",
///  "bucket_cap_mb"}. An optimizer is {"name", "lr", ..., every
///  OptimizerConfig option (null when unset), "params", "param_groups":
///  [{"pattern", "options": {name: value}}], "scheduler": null | {"name",
///  "final_lr_factor", "t_max", "step_size", "gamma", "warmup": {"steps",
///  "start_factor"}, "plateau": {"monitor", "factor", "patience",
///  "threshold", "cooldown", "min_lr", "eps"}}}. Never throws.
std::string strategy_options_to_spec(const StrategyOptions& options);

/// Inverse of strategy_options_to_spec: the spec's knobs on top of
/// `runtime` (whose device, communicator, precision_plugin and validation
/// data are kept; the spec's validation cadence is applied to
/// runtime.validation, which must then be set).
/// @throws ConfigError naming the key path ("spec.optimizer.scheduler.gamma")
///   for invalid JSON, an unknown key, a wrong type, another spec_version,
///   or a validation block without runtime.validation data.
StrategyOptions strategy_options_from_spec(const std::string& spec_json,
                                           const StrategyOptions& runtime = {});

}  // namespace crucible
