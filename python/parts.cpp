// A training strategy from parts in Python (issue 49; seed 002's way):
// datasets, loaders, a model built from a recipe and its data, then a
// TrainingStrategy of that model with a spec, a loss, validation data and
// hooks. python/crucible/parts.py wraps these.

#include "python/training.h"

#include "crucible/common/dtype_names.h"
#include "crucible/common/error.h"
#include "crucible/config/config.h"
#include "crucible/data/dataset.h"
#include "crucible/data/formats.h"
#include "crucible/data/structure_checks.h"
#include "crucible/run/data_paths.h"
#include "crucible/run/model_from_data.h"
#include "crucible/run/model_io.h"
#include "crucible/run/training_setup.h"
#include "crucible/training/strategy.h"
#include "crucible/training/strategy_spec.h"

#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace crucible::python {
namespace {

/// Structures with their neighbor lists at one cutoff, and the data keys
/// they were read with.
struct Dataset {
  std::shared_ptr<AtomicDataset> data;
  DataConfig keys;
};

/// `path` read with the recipe's data.* keys and units (`data_json`: a JSON
/// object of recipe keys, "" for the defaults), checked, with neighbor lists
/// at `cutoff` Å. @throws ConfigError / DataError naming the key or file.
Dataset read_dataset(const std::string& path, double cutoff, const std::string& data_json) {
  const Config config = load_run_config_text(data_json, "data dict", {});
  const std::string file = resolve_data_path(path, "Dataset path");
  std::vector<Structure> structures = read_structures(file, config.data.format, extxyz_options(config.data));
  if (structures.empty()) throw DataError(file + ": must contain at least one structure, got none");
  check_structures(structures, "Dataset path");
  return {std::make_shared<AtomicDataset>(std::move(structures), cutoff), config.data};
}

py::tuple split(const Dataset& d, double valid_fraction, uint64_t seed) {
  const auto [ti, vi] = random_split(d.data->size(), valid_fraction, seed);
  auto pick = [&](const std::vector<int64_t>& idx) {
    std::vector<Structure> s;
    for (int64_t i : idx) s.push_back(d.data->structure(i));
    return Dataset{std::make_shared<AtomicDataset>(std::move(s), d.data->cutoff()), d.keys};
  };
  return py::make_tuple(pick(ti), pick(vi));
}

struct Loader {
  std::shared_ptr<DataLoader> loader;
};

/// The model and the metadata save_model writes.
struct Model {
  std::shared_ptr<EnergyModel> model;
  ModelMetadata meta;
};

/// A strategy of one model ("main") and the Python hooks' errors.
class Strategy {
 public:
  Strategy(const Model& model, const std::string& spec_json, const std::string& loss_json,
           const Dataset* valid, const py::list& hooks, const std::string& device)
      : model_(model), errors_(std::make_shared<HookErrors>()) {
    const Config loss_config = load_run_config_text(loss_json, "loss dict", {});
    StrategyOptions runtime;
    runtime.device = parse_device(device);
    if (valid) {
      ValidationConfig vc;
      vc.data = valid->data;
      runtime.validation = vc;
    }
    strategy_ = TrainingStrategy::from_spec(spec_json, {{"main", model.model}},
                                            loss_from_settings(loss_config.training.loss),
                                            wrap_hooks(hooks, errors_), {}, runtime);
  }
  py::object run(const Loader& loader) {
    {
      py::gil_scoped_release release;
      strategy_->run(*loader.loader);
    }
    return take_error();
  }
  py::object validate() {
    ValidationSummary v;
    {
      py::gil_scoped_release release;
      v = strategy_->validate();
    }
    return summary_dict(v);
  }
  void save_model(const std::string& run_dir) {
    ModelMetadata meta = model_.meta;
    meta.dtype = dtype_name(model_.model->module().parameters().at(0).scalar_type());
    py::gil_scoped_release release;
    crucible::save_model(run_dir, *model_.model, meta);
    model_.model->module().to(strategy_->options().device);  // save_model moved it to CPU
  }
  TrainingStrategy& get() { return *strategy_; }

 private:
  /// The first hook error of the last call (then cleared), or None.
  py::object take_error() {
    std::lock_guard<std::mutex> lock(errors_->mutex);
    if (errors_->first.empty()) return py::none();
    std::string e = std::move(errors_->first);
    errors_->first.clear();
    return py::str(e);
  }
  Model model_;
  std::shared_ptr<HookErrors> errors_;
  std::unique_ptr<TrainingStrategy> strategy_;
};

}  // namespace

void bind_parts(py::module_& m) {
  m.def("_default_spec", [] {
    // Every key of the spec layout at StrategyOptions' defaults, with the
    // default validation cadence: what a user's partial spec is merged over.
    StrategyOptions o;
    o.validation = ValidationConfig{};
    return strategy_options_to_spec(o);
  });
  py::class_<Dataset>(m, "_Dataset")
      .def(py::init(&read_dataset), py::arg("path"), py::arg("cutoff"), py::arg("data_json"))
      .def("__len__", [](const Dataset& d) { return d.data->size(); })
      .def_property_readonly("cutoff", [](const Dataset& d) { return d.data->cutoff(); })
      .def_property_readonly("num_atoms", [](const Dataset& d) { return d.data->total_atoms(); })
      .def("split", &split, py::arg("valid_fraction"), py::arg("seed"));
  py::class_<Loader>(m, "_DataLoader")
      .def(py::init([](const Dataset& d, int64_t batch_size, bool shuffle, uint64_t seed) {
             DataLoaderOptions o;
             o.batch_size = batch_size;
             o.shuffle = shuffle;
             o.seed = seed;
             return Loader{std::make_shared<DataLoader>(d.data, o)};
           }),
           py::arg("dataset"), py::arg("batch_size"), py::arg("shuffle"), py::arg("seed"))
      .def("__len__", [](const Loader& l) { return l.loader->size(); });
  py::class_<Model>(m, "_Model")
      .def(py::init([](const Dataset& train, const std::string& recipe_json) {
             const Config config = load_run_config_text(recipe_json, "recipe dict", {});
             BuiltModel b = build_model_from_data(config, *train.data);
             for (const auto& w : b.warnings) PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1);
             b.meta.data = train.keys;  // the keys its data was read with, for evaluate
             return Model{b.model, b.meta};
           }),
           py::arg("train"), py::arg("recipe_json"))
      .def_property_readonly("type", [](const Model& x) { return x.meta.model_type; })
      .def_property_readonly("cutoff", [](const Model& x) { return x.model->cutoff(); })
      .def_property_readonly("dtype", [](const Model& x) { return x.meta.dtype; })
      .def_property_readonly("num_parameters", [](const Model& x) {
        int64_t n = 0;
        for (const auto& p : x.model->module().parameters()) n += p.numel();
        return n;
      })
      .def_property_readonly("hyperparameters", [](const Model& x) { return x.meta.hyperparameters.dump(); });
  py::class_<Strategy>(m, "_Strategy")
      .def(py::init([](const Model& model, const std::string& spec, const std::string& loss,
                       const Dataset* valid, const py::list& hooks, const std::string& device) {
             return std::make_unique<Strategy>(model, spec, loss, valid, hooks, device);
           }),
           py::arg("model"), py::arg("spec_json"), py::arg("loss_json"), py::arg("valid").none(true),
           py::arg("hooks"), py::arg("device"))
      .def("run", &Strategy::run, py::arg("loader"))
      .def("validate", &Strategy::validate)
      .def("save_model", &Strategy::save_model, py::arg("run_dir"))
      .def("to_spec", [](Strategy& s) { return s.get().to_spec(); })
      .def("save_checkpoint", [](Strategy& s, const std::string& dir) { return s.get().save_checkpoint(dir); },
           py::arg("dir"))
      .def("restore_checkpoint", [](Strategy& s, const std::string& dir) { return s.get().restore_checkpoint(dir); },
           py::arg("dir"))
      .def("close", [](Strategy& s) { s.get().close(); })
      .def_property_readonly("step_count", [](Strategy& s) { return s.get().step_count; })
      .def_property_readonly("epoch_count", [](Strategy& s) { return s.get().epoch_count; })
      .def_property_readonly("batch_count", [](Strategy& s) { return s.get().batch_count; })
      .def_property_readonly("finish_reason", [](Strategy& s) { return s.get().finish_reason(); });
}

}  // namespace crucible::python
