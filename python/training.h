#pragma once
// The training loop from Python (issue 49): bindings of python/training.cpp,
// registered into the _crucible module by python/module.cpp.

#include "crucible/training/hook.h"
#include "crucible/training/metrics.h"
#include "crucible/training/stages.h"

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace crucible::python {

/// What a Python hook gets as `ctx` (seed 002 TrainContext): a view of the
/// C++ context valid during one hook call; invalidate() afterwards makes
/// every access raise RuntimeError (a hook that keeps ctx cannot read freed
/// state).
class Context {
 public:
  Context(TrainContext* ctx, TrainingStage stage) : ctx_(ctx), stage_(stage) {}
  void invalidate() { ctx_ = nullptr; }
  /// @throws std::runtime_error after invalidate().
  void check() const;
  const TrainContext* raw() const { return ctx_; }
  TrainingStage stage() const { return stage_; }
  /// The total loss (detached) as a Python float, or None before the loss.
  pybind11::object loss() const;
  /// The unweighted loss terms by name ("energy", "forces", ...), floats.
  pybind11::dict loss_components() const;
  /// Structures / atoms of the batch, or None where the stage has no batch.
  pybind11::object batch_size() const;
  pybind11::object num_atoms() const;
  /// The lr of every param group of every optimizer, in order.
  std::vector<double> learning_rates() const;
  /// The last validation summary as a dict (as_map() keys in meV units,
  /// loss, loss_components, num_structures), or None.
  pybind11::object validation() const;
  /// name → torch.Tensor sharing memory with the parameter ("" = the
  /// primary model). @throws std::invalid_argument for an unknown model.
  pybind11::dict parameters(const std::string& model) const;
  /// TrainingStrategy::request_finish(reason): the run ends normally after
  /// this batch (final validation, model.pt, summary.json).
  void request_stop(const std::string& reason);

 private:
  TrainContext* ctx_;
  TrainingStage stage_;
};

/// The first Python exception a hook of a run raised, with its traceback
/// (the run stops after that batch; the caller raises crucible.HookError).
struct HookErrors {
  std::mutex mutex;
  std::string first;
};

/// (kind, object) pairs ("hook" or "update", a crucible.Hook or
/// TrainingUpdateHook) as C++ hooks, in the given order; their Python
/// exceptions go to `errors`. @throws std::invalid_argument for bad stages.
std::vector<std::shared_ptr<Hook>> wrap_hooks(const pybind11::list& hooks, const std::shared_ptr<HookErrors>& errors);

/// A validation summary as a dict: ErrorMetrics::as_map() keys (meV/atom,
/// meV/Å, meV/Å³), loss, loss_components, num_structures, inference_model.
pybind11::dict summary_dict(const ValidationSummary& summary);

/// Registers _Dataset, _DataLoader, _Model and _Strategy (python/parts.cpp).
void bind_parts(pybind11::module_& m);

/// Registers TrainingStage, Context, the error types (ConfigError,
/// DataError as ValueError; TrainingError as RuntimeError) and _train,
/// _resume, _time_hook, _time_cpp_hook into `m`.
void bind_training(pybind11::module_& m);

}  // namespace crucible::python
