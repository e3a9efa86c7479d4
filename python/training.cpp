// The training loop from Python (issue 49): crucible.train / resume, Python
// hooks and update hooks run by the C++ strategy, the context they see.
// The Python layer (python/crucible/training.py) wraps these.
//
// Threads and the GIL: run_training runs with the GIL released; every call
// into Python (a hook, a line of output) takes it for that call only.

#include "python/training.h"

#include "crucible/common/error.h"
#include "crucible/config/config.h"
#include "crucible/run/data_paths.h"
#include "crucible/run/run_dir.h"
#include "crucible/run/training_run.h"
#include "crucible/training/hook.h"
#include "crucible/training/stages.h"
#include "crucible/training/strategy.h"
#include "crucible/training/update_hook.h"

#include <ATen/DLConvertor.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <streambuf>
#include <string>
#include <vector>

namespace py = pybind11;

namespace crucible::python {
namespace {

// ------------------------------------------------------------ tensors out

void delete_unused_dlpack(PyObject* capsule) {
  // A consumer renames the capsule "used_dltensor" and owns the tensor.
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* dl = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (dl && dl->deleter) dl->deleter(dl);
}

/// `t` as a torch.Tensor sharing its memory (DLPack, zero copy): in-place
/// changes on either side are seen by the other. No autograd history.
py::object to_torch(const at::Tensor& t) {
  DLManagedTensor* dl = at::toDLPack(t.detach());
  py::capsule capsule(dl, "dltensor", &delete_unused_dlpack);
  return py::module_::import("torch.utils.dlpack").attr("from_dlpack")(capsule);
}

// ------------------------------------------------------------ errors

/// "Traceback (most recent call last): ..." of the exception `e` holds.
std::string format_python_error(py::error_already_set& e) {
  try {
    py::object lines = py::module_::import("traceback")
                           .attr("format_exception")(e.type(), e.value(), e.trace());
    std::string text;
    for (const auto& line : lines) text += line.cast<std::string>();
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  } catch (const std::exception&) {
    return e.what();
  }
}

/// Records the exception (the first of the run is kept) and asks the run to
/// stop after this batch: the checkpoint written then makes the run
/// directory resumable. Holds the GIL.
void record_hook_error(HookErrors& errors, py::error_already_set& e, const std::string& hook,
                       TrainContext& ctx, TrainingStage stage) {
  const std::string text = format_python_error(e);
  {
    std::lock_guard<std::mutex> lock(errors.mutex);
    if (errors.first.empty()) {
      errors.first = "Python hook '" + hook + "' raised at " + stage_name(stage) + " (step " +
                     std::to_string(ctx.step_count) + ", epoch " + std::to_string(ctx.epoch_count) +
                     "):\n" + text;
    }
  }
  if (ctx.strategy) ctx.strategy->request_stop();
}

// ------------------------------------------------------------ hook adapters

/// Runs `body(ctx_view)` with the GIL, where ctx_view is a crucible.Context
/// of `ctx` valid for this call only. A Python exception `body` raises is
/// recorded (record_hook_error: the run stops after this batch).
template <class Body>
void call_with_context(TrainContext& ctx, TrainingStage stage, HookErrors& errors, const std::string& hook,
                       Body&& body) {
  py::gil_scoped_acquire gil;
  auto context = std::make_shared<Context>(&ctx, stage);
  try {
    body(py::cast(context));
  } catch (py::error_already_set& e) {
    record_hook_error(errors, e, hook, ctx, stage);
  }
  context->invalidate();
}

std::set<TrainingStage> stages_of(const py::handle& obj, const std::string& name,
                                  const std::set<TrainingStage>& fallback) {
  if (!py::hasattr(obj, "stages") || obj.attr("stages").is_none()) {
    if (!fallback.empty()) return fallback;
    throw std::invalid_argument("hook '" + name + "': stages must be a set of crucible.TrainingStage, "
                                "got no stages attribute");
  }
  std::set<TrainingStage> out;
  for (const auto& s : obj.attr("stages")) {
    try {
      out.insert(s.cast<TrainingStage>());
    } catch (const py::cast_error&) {
      throw std::invalid_argument("hook '" + name + "': stages must hold crucible.TrainingStage "
                                  "values, got " + py::repr(s).cast<std::string>());
    }
  }
  return out;
}

std::string name_of(const py::handle& obj) {
  if (py::hasattr(obj, "name") && py::isinstance<py::str>(obj.attr("name"))) {
    return obj.attr("name").cast<std::string>();
  }
  return py::type::of(obj).attr("__name__").cast<std::string>();
}

/// A Python crucible.Hook: `obj(ctx, stage)` on its `stages`, every
/// `frequency` optimizer steps.
class PyHook : public Hook {
 public:
  PyHook(py::object obj, std::shared_ptr<HookErrors> errors)
      : obj_(std::move(obj)), errors_(std::move(errors)), name_(name_of(obj_)) {
    stages_ = stages_of(obj_, name_, {});
    for (TrainingStage s : {TrainingStage::DO_BACKWARD, TrainingStage::DO_OPTIMIZER_STEP}) {
      if (stages_.count(s) > 0) {
        throw std::invalid_argument("hook '" + name_ + "': " + stage_name(s) + " is owned by update "
                                    "hooks; subclass crucible.TrainingUpdateHook to take part in it");
      }
    }
    frequency_ = py::hasattr(obj_, "frequency") ? obj_.attr("frequency").cast<int64_t>() : 1;
    if (frequency_ < 1) {
      throw std::invalid_argument("hook '" + name_ + "': frequency must be >= 1, got " +
                                  std::to_string(frequency_));
    }
  }
  ~PyHook() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  std::string name() const override { return name_; }
  bool runs_on_stage(TrainingStage stage) const override { return stages_.count(stage) > 0; }
  int64_t frequency() const override { return frequency_; }
  void operator()(TrainContext& ctx, TrainingStage stage) override {
    call_with_context(ctx, stage, *errors_, name_, [&](const py::object& c) { obj_(c, py::cast(stage)); });
  }

 private:
  py::object obj_;
  std::shared_ptr<HookErrors> errors_;
  std::string name_;
  std::set<TrainingStage> stages_;
  int64_t frequency_ = 1;
};

/// The update stages a crucible.TrainingUpdateHook is called on (seed 001).
const std::set<TrainingStage>& update_stages() {
  static const std::set<TrainingStage> s{TrainingStage::SETUP, TrainingStage::BEFORE_BATCH,
                                         TrainingStage::DO_BACKWARD, TrainingStage::DO_OPTIMIZER_STEP,
                                         TrainingStage::AFTER_OPTIMIZER_STEP};
  return s;
}

/// A Python crucible.TrainingUpdateHook: `obj(ctx, stage, will_skip)` on
/// its claimed `stages` (default every update stage), in `priority` order
/// with the C++ update hooks; False (or (False, None)) vetoes the gated
/// operation of BEFORE_BATCH (zero_grad) or DO_OPTIMIZER_STEP (the step).
class PyUpdateHook : public TrainingUpdateHook {
 public:
  PyUpdateHook(py::object obj, std::shared_ptr<HookErrors> errors)
      : obj_(std::move(obj)), errors_(std::move(errors)), name_(name_of(obj_)) {
    stages_ = stages_of(obj_, name_, update_stages());
    for (TrainingStage s : stages_) {
      if (update_stages().count(s) == 0) {
        throw std::invalid_argument("update hook '" + name_ + "': stages must be update stages (SETUP, "
                                    "BEFORE_BATCH, DO_BACKWARD, DO_OPTIMIZER_STEP, AFTER_OPTIMIZER_STEP), "
                                    "got " + stage_name(s) + "; use crucible.Hook for other stages");
      }
    }
    priority_ = py::hasattr(obj_, "priority") ? obj_.attr("priority").cast<int>() : update_priority::kDefault;
  }
  ~PyUpdateHook() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  std::string name() const override { return name_; }
  int priority() const override { return priority_; }
  using TrainingUpdateHook::operator();
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override {
    if (stages_.count(stage) == 0) return {true, ctx.loss};
    bool proceed = true;
    call_with_context(ctx, stage, *errors_, name_, [&](const py::object& c) {
      proceed = decision(obj_(c, py::cast(stage), will_skip));
    });
    return {proceed, ctx.loss};
  }

 private:
  /// True / None / (True, None) proceed; False / (False, None) veto.
  /// @throws py::error_already_set (TypeError) for anything else.
  bool decision(const py::object& r) const {
    py::object value = r;
    if (py::isinstance<py::tuple>(r)) {
      const auto t = r.cast<py::tuple>();
      if (t.size() != 2 || !t[1].is_none()) {
        throw_type_error("must return a bool or (bool, None); a loss cannot be returned from Python "
                         "(its autograd graph lives in C++), got " + py::repr(r).cast<std::string>());
      }
      value = t[0];
    }
    if (value.is_none()) return true;
    if (!py::isinstance<py::bool_>(value)) {
      throw_type_error("must return a bool or (bool, None), got " + py::repr(r).cast<std::string>());
    }
    return value.cast<bool>();
  }
  void throw_type_error(const std::string& what) const {
    PyErr_SetString(PyExc_TypeError, ("update hook '" + name_ + "' " + what).c_str());
    throw py::error_already_set();
  }

  py::object obj_;
  std::shared_ptr<HookErrors> errors_;
  std::string name_;
  std::set<TrainingStage> stages_;
  int priority_ = update_priority::kDefault;
};

// ------------------------------------------------------------ output

/// An ostream buffer that hands whole lines to a Python file object
/// (sys.stdout / sys.stderr), taking the GIL per line.
class PythonLineBuffer : public std::streambuf {
 public:
  explicit PythonLineBuffer(const char* stream) : stream_(stream) {}
  ~PythonLineBuffer() override { sync(); }

 protected:
  int_type overflow(int_type c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    line_ += static_cast<char>(c);
    if (c == '\n' || c == '\r') flush_line();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i) overflow(traits_type::to_int_type(s[i]));
    return n;
  }
  int sync() override {
    if (!line_.empty()) flush_line();
    return 0;
  }

 private:
  void flush_line() {
    py::gil_scoped_acquire gil;
    try {
      py::object file = py::module_::import("sys").attr(stream_);
      file.attr("write")(line_);
      file.attr("flush")();
    } catch (py::error_already_set&) {
      // a closed or replaced stream: the line is dropped, training goes on
    }
    line_.clear();
  }
  const char* stream_;
  std::string line_;
};

/// What _train and _resume return to python/crucible/training.py.
py::dict result_dict(const TrainResult& r, const std::string& run_dir, const HookErrors& errors) {
  py::dict d;
  d["run_dir"] = run_dir;
  d["stopped"] = r.stopped;
  d["signal"] = r.signal;
  d["steps"] = r.steps;
  d["epochs"] = r.epochs;
  d["hook_error"] = errors.first.empty() ? py::object(py::none()) : py::object(py::str(errors.first));
  return d;
}

/// run_training with the GIL released, output to Python's sys.stdout and
/// sys.stderr.
py::dict run(const Config& config, const std::string& command, const ResumeOptions& resume,
             const py::list& hooks) {
  auto errors = std::make_shared<HookErrors>();
  const std::vector<std::shared_ptr<Hook>> wrapped = wrap_hooks(hooks, errors);
  PythonLineBuffer out_buf("stdout"), err_buf("stderr");
  std::ostream out(&out_buf), err(&err_buf);
  TrainResult r;
  {
    py::gil_scoped_release release;
    r = run_training(config, out, err, command, resume, wrapped);
    out.flush();
    err.flush();
  }
  return result_dict(r, *config.output.run_dir, *errors);
}

}  // namespace

std::vector<std::shared_ptr<Hook>> wrap_hooks(const py::list& hooks, const std::shared_ptr<HookErrors>& errors) {
  std::vector<std::shared_ptr<Hook>> out;
  for (const auto& item : hooks) {
    const auto pair = item.cast<py::tuple>();
    const std::string kind = pair[0].cast<std::string>();
    py::object obj = py::reinterpret_borrow<py::object>(pair[1]);
    if (kind == "update") {
      out.push_back(std::make_shared<PyUpdateHook>(std::move(obj), errors));
    } else {
      out.push_back(std::make_shared<PyHook>(std::move(obj), errors));
    }
  }
  return out;
}

// ------------------------------------------------------------ Context

void Context::check() const {
  if (!ctx_) {
    throw std::runtime_error("crucible: a hook's ctx is valid only during the call it was passed to; "
                             "copy the values you need (ctx.loss, ctx.parameters[...].clone())");
  }
}

py::object Context::loss() const {
  check();
  if (!ctx_->loss.defined()) return py::none();
  return py::float_(ctx_->loss.detach().item<double>());
}

py::dict Context::loss_components() const {
  check();
  py::dict d;
  if (ctx_->losses) {
    for (const auto& [k, v] : ctx_->losses->components) d[py::str(k)] = v.detach().item<double>();
  }
  return d;
}

py::object Context::batch_size() const {
  check();
  if (!ctx_->batch) return py::none();
  return py::int_(ctx_->batch->num_graphs());
}

py::object Context::num_atoms() const {
  check();
  if (!ctx_->batch) return py::none();
  return py::int_(ctx_->batch->positions.size(0));
}

std::vector<double> Context::learning_rates() const {
  check();
  std::vector<double> out;
  for (auto* opt : ctx_->optimizers) {
    if (!opt) continue;
    for (auto& group : opt->param_groups()) out.push_back(group.options().get_lr());
  }
  return out;
}

py::object Context::validation() const {
  check();
  if (!ctx_->validation) return py::none();
  return summary_dict(*ctx_->validation);
}

py::dict summary_dict(const ValidationSummary& v) {
  py::dict d;
  for (const auto& [k, x] : v.as_map()) d[py::str(k)] = x;
  d["loss"] = v.loss;
  d["loss_components"] = v.loss_components;
  d["num_structures"] = v.num_structures;
  d["inference_model"] = v.inference_model;
  return d;
}

py::dict Context::parameters(const std::string& model) const {
  check();
  EnergyModel* m = ctx_->model;
  if (!model.empty()) {
    auto it = ctx_->models.find(model);
    if (it == ctx_->models.end()) throw std::invalid_argument("ctx.model_parameters: no model named '" + model + "'");
    m = it->second;
  }
  py::dict d;
  if (!m) return d;
  for (const auto& item : m->module().named_parameters(true)) d[py::str(item.key())] = to_torch(item.value());
  return d;
}

void Context::request_stop(const std::string& reason) {
  check();
  if (!ctx_->strategy) throw std::runtime_error("ctx.request_stop: this context has no strategy");
  ctx_->strategy->request_finish(reason);
}

#define CRUCIBLE_COUNTER(field) \
  [](const Context& c) {        \
    c.check();                  \
    return c.raw()->field;      \
  }

void bind_training(py::module_& m) {
  py::register_exception<ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<DataError>(m, "DataError", PyExc_ValueError);
  py::register_exception<TrainingError>(m, "TrainingError", PyExc_RuntimeError);

  py::enum_<TrainingStage> stages(m, "TrainingStage", "The lifecycle stages of a training run (seed 002).");
  for (int i = 0; i < kNumTrainingStages; ++i) {
    const auto s = static_cast<TrainingStage>(i);
    stages.value(stage_name(s), s);
  }

  py::class_<Context, std::shared_ptr<Context>>(
      m, "Context",
      "What a hook sees at a stage (seed 002 TrainContext), valid during the call only. Counters, the "
      "detached loss (float, None before the loss), its components, the batch's size, the learning "
      "rates, the last validation summary, and the model's parameters as torch.Tensor views that share "
      "memory with the training model (an in-place change is seen by the next step).")
      .def_property_readonly("stage", [](const Context& c) { return c.stage(); })
      .def_property_readonly("step_count", CRUCIBLE_COUNTER(step_count), "optimizer steps taken")
      .def_property_readonly("global_step_count", CRUCIBLE_COUNTER(global_step_count), "steps × world size")
      .def_property_readonly("batch_count", CRUCIBLE_COUNTER(batch_count), "batches processed (skipped steps included)")
      .def_property_readonly("epoch_count", CRUCIBLE_COUNTER(epoch_count), "completed epochs")
      .def_property_readonly("epoch_step_count", CRUCIBLE_COUNTER(epoch_step_count), "batches processed in this epoch")
      .def_property_readonly("global_rank", CRUCIBLE_COUNTER(global_rank))
      .def_property_readonly("optimizer_step_skipped", CRUCIBLE_COUNTER(optimizer_step_skipped),
                             "at AFTER_OPTIMIZER_STEP: the step was vetoed or skipped")
      .def_property_readonly("loss", &Context::loss, "the batch's total loss as a float (detached), or None")
      .def_property_readonly("loss_components", &Context::loss_components, "unweighted loss terms by name")
      .def_property_readonly("batch_size", &Context::batch_size, "structures in the batch, or None")
      .def_property_readonly("num_atoms", &Context::num_atoms, "atoms in the batch, or None")
      .def_property_readonly("learning_rates", &Context::learning_rates,
                             "the lr of every param group of every optimizer, in order")
      .def_property_readonly("validation", &Context::validation,
                             "the last validation summary (meV/atom, meV/Å, meV/Å³; loss), or None")
      .def_property_readonly("parameters", [](const Context& c) { return c.parameters(""); },
                             "name → torch.Tensor of the primary model's parameters (shared memory)")
      .def("model_parameters", &Context::parameters, py::arg("model"),
           "name → torch.Tensor of the named model's parameters (shared memory)")
      .def("request_stop", &Context::request_stop, py::arg("reason") = "stopped by a Python hook",
           "End the run after this batch as early stopping does: the final validation, model.pt and "
           "summary.json are written, and the summary records `reason`.");

  m.def(
      "_train",
      [](const std::string& config_text, const std::string& config_file, const std::vector<std::string>& overrides,
         const py::list& hooks, const std::optional<std::string>& run_dir) {
        Config config = config_file.empty()
                            ? load_run_config_text(config_text, "config dict", overrides)
                            : load_run_config(resolve_config_path(config_file), overrides);
        validate_config(config);
        if (run_dir) config.output.run_dir = *run_dir;
        // Chosen now so that messages (and a resume) can name it.
        if (!config.output.run_dir) config.output.run_dir = choose_run_dir(config.output).string();
        return run(config, "crucible.train (Python)", {}, hooks);
      },
      py::arg("config_text"), py::arg("config_file"), py::arg("overrides"), py::arg("hooks"), py::arg("run_dir"));
  m.def(
      "_resume",
      [](const std::string& run_dir, const py::list& hooks, std::optional<int64_t> checkpoint) {
        Config config = load_run_config(run_dir + "/config.yaml", {});
        validate_config(config);
        config.output.run_dir = run_dir;
        ResumeOptions resume;
        resume.resume = true;
        resume.checkpoint = checkpoint;
        return run(config, "crucible.resume (Python)", resume, hooks);
      },
      py::arg("run_dir"), py::arg("hooks"), py::arg("checkpoint") = py::none());
  m.def(
      "_time_hook",
      [](const py::object& hook, const std::string& kind, int64_t calls) {
        // µs per call of one hook on one stage, the GIL released between
        // calls as during a run (the bench's overhead figure).
        auto errors = std::make_shared<HookErrors>();
        py::list one;
        one.append(py::make_tuple(kind, hook));
        const auto wrapped = wrap_hooks(one, errors);
        TrainContext ctx;
        const TrainingStage stage = kind == "update" ? TrainingStage::BEFORE_BATCH : TrainingStage::AFTER_BATCH;
        double seconds = 0;
        {
          py::gil_scoped_release release;
          const auto t0 = std::chrono::steady_clock::now();
          for (int64_t i = 0; i < calls; ++i) {
            if (kind == "update") {
              (*std::static_pointer_cast<TrainingUpdateHook>(wrapped[0]))(ctx, stage, false);
            } else {
              (*wrapped[0])(ctx, stage);
            }
          }
          seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        if (!errors->first.empty()) throw std::runtime_error(errors->first);
        return 1e6 * seconds / static_cast<double>(calls);
      },
      py::arg("hook"), py::arg("kind"), py::arg("calls"));
  m.def(
      "_time_cpp_hook",
      [](int64_t calls) {
        // The same figure for an empty C++ hook (LambdaHook), the baseline.
        LambdaHook hook("empty", {TrainingStage::AFTER_BATCH}, [](TrainContext&, TrainingStage) {});
        TrainContext ctx;
        py::gil_scoped_release release;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < calls; ++i) hook(ctx, TrainingStage::AFTER_BATCH);
        return 1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
               static_cast<double>(calls);
      },
      py::arg("calls"));
}

}  // namespace crucible::python
