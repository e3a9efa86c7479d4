// The `crucible` Python module (issue 17): a trained model of any
// registered type, loaded from a run directory or model.pt + model.json,
// evaluated on one structure with Crucible's own neighbor list. The ASE
// calculator (python/crucible/calculator.py) wraps it.
//
// Built by the normal build into build/python/crucible/ (PYTHONPATH=build/python).
// LibTorch is the same shared build as Debian's python3-torch, so the module
// imports beside `import torch`. The GIL is released while it computes.

#include "crucible/common/dtype_names.h"
#include "crucible/run/mace_files.h"
#include "crucible/run/model_io.h"
#include "crucible/data/batch.h"
#include "crucible/data/extxyz.h"
#include "crucible/data/structure_checks.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "crucible/neighbors/neighbor_list.h"
#include "crucible/training/allocator.h"
#include "python/training.h"

#include <torch/version.h>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace crucible {
namespace {

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

at::Tensor to_tensor(const Array& a, std::vector<int64_t> shape, const char* what) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (a.size() != n) throw std::invalid_argument(std::string(what) + " must have " + std::to_string(n) + " values, got " + std::to_string(a.size()));
  at::Tensor t = at::empty(shape, at::kDouble);
  std::memcpy(t.data_ptr<double>(), a.data(), static_cast<size_t>(n) * sizeof(double));
  return t;
}

py::array_t<double> to_numpy(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU, at::kDouble).contiguous();
  py::array_t<double> out(c.sizes().vec());
  std::memcpy(out.mutable_data(), c.data_ptr<double>(), static_cast<size_t>(c.numel()) * sizeof(double));
  return out;
}

/// A loaded model and its metadata.
class Model {
 public:
  Model(const std::string& path, const std::string& dtype, bool exact) {
    // Freed blocks of 16 MiB or more are kept for the next call, as the
    // crucible executables do: under python3's glibc malloc each MD-sized
    // temporary was mmap'd and page-faulted again on every call (issue 19).
    // CRUCIBLE_DEFAULT_MALLOC=1 in the environment leaves LibTorch's allocator.
    install_large_block_cache();
    loaded_ = load_model(path);  // a run directory, or a weights file (model.pt, model_last.pt)
    // "" = the dtype the model was trained and saved in (issue 47).
    const std::string chosen = dtype.empty() ? loaded_.meta.dtype : dtype;
    const auto t = dtype_from_name(chosen);
    if (!t) throw std::invalid_argument("dtype must be " + dtype_choices() + " or None, got \"" + dtype + "\"");
    dtype_ = *t;
    loaded_.model->module().to(dtype_);
    loaded_.model->module().eval();
    // exact: MACE's radial MLP and SchNet's filter network per pair instead
    // of their splines (issue 48).
    if (exact) {
      if (auto* mace = dynamic_cast<MaceImpl*>(loaded_.model.get())) mace->set_radial_spline(false);
      if (auto* schnet = dynamic_cast<SchNetImpl*>(loaded_.model.get())) schnet->set_filter_spline(false);
    }
  }

  py::dict metadata() const {
    const auto& m = loaded_.meta;
    py::dict d;
    d["type"] = m.model_type;
    d["cutoff"] = loaded_.model->cutoff();
    py::list elements;
    for (int64_t z : m.atomic_numbers) elements.append(chemical_symbol(z));
    d["elements"] = elements;
    d["atomic_numbers"] = m.atomic_numbers;
    py::dict e0;
    for (const auto& [z, v] : m.e0) e0[py::str(chemical_symbol(z))] = v;
    d["e0"] = e0;
    d["scale"] = m.scale;
    d["shift"] = m.shift;
    d["hyperparameters"] = m.hyperparameters.dump();
    d["trained_dtype"] = m.dtype;
    d["min_distance"] = m.min_distance ? *m.min_distance : 0.1;
    d["dtype"] = dtype_name(dtype_);
    d["units"] = py::dict(py::arg("energy") = "eV", py::arg("forces") = "eV/Å", py::arg("stress") = "eV/Å^3",
                          py::arg("length") = "Å");
    return d;
  }

  /// Energy (eV), forces [N,3] (eV/Å), stress [3,3] (eV/Å³, ASE sign; None
  /// unless asked for and the structure is periodic with a cell of non-zero
  /// volume) and per-atom energies [N] (eV) of one structure.
  py::dict compute(const Array& positions, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& numbers,
                   const Array& cell, const std::array<bool, 3>& pbc, bool stress) {
    const int64_t n = static_cast<int64_t>(numbers.size());
    Structure s;
    s.positions = to_tensor(positions, {n, 3}, "positions");
    s.atomic_numbers = at::empty({n}, at::kLong);
    std::memcpy(s.atomic_numbers.data_ptr<int64_t>(), numbers.data(), static_cast<size_t>(n) * sizeof(int64_t));
    s.cell = to_tensor(cell, {3, 3}, "cell");
    s.pbc = pbc;
    s.source = "structure";
    ModelOutputs out;
    at::Tensor node;
    {
      py::gil_scoped_release release;  // autograd runs without the GIL
      check_known_elements(loaded_.meta.atomic_numbers, s.atomic_numbers);
      StructureLimits limits;  // the model's minimum distance (model.json)
      if (loaded_.meta.min_distance) limits.min_distance = *loaded_.meta.min_distance;
      check_structures({s}, "structure", limits);
      const NeighborList nl = build_neighbor_list(s.positions, s.cell, s.pbc, loaded_.model->cutoff());
      const Batch batch = collate({&s}, {&nl}).to(at::kCPU, dtype_);
      ComputeOptions co;
      co.forces = true;
      co.stress = stress && s.has_volume();  // defined only with a volume (issue 47)
      co.energies = true;  // per-atom energies from the same evaluation
      out = compute_outputs(*loaded_.model, batch, co);
      node = out.energies;
    }
    py::dict d;
    d["energy"] = out.energy.sum().item<double>();
    d["forces"] = to_numpy(out.forces);
    d["stress"] = out.stress.defined() ? py::object(to_numpy(out.stress[0])) : py::object(py::none());
    d["energies"] = to_numpy(node);
    return d;
  }

 private:
  LoadedModel loaded_;
  at::ScalarType dtype_ = at::kDouble;
};

}  // namespace
}  // namespace crucible

PYBIND11_MODULE(_crucible, m) {
  m.doc() = "Crucible: machine-learned interatomic potentials (C++ / LibTorch)";
  py::class_<crucible::Model>(m, "Model")
      .def(py::init<const std::string&, const std::string&, bool>(), py::arg("path"), py::arg("dtype") = "",
           py::arg("exact") = false)
      .def("metadata", &crucible::Model::metadata)
      .def("compute", &crucible::Model::compute, py::arg("positions"), py::arg("numbers"), py::arg("cell"),
           py::arg("pbc"), py::arg("stress") = true);
  m.def(
      "import_mace",
      [](const std::string& file, const std::string& hyperparameters, const std::string& out_dir) {
        crucible::ImportMaceRequest req{file, hyperparameters, out_dir};
        std::ostringstream text;
        py::gil_scoped_release release;  // the probe runs autograd, which must not hold the GIL
        crucible::run_import_mace(req, text);
        return text.str();
      },
      py::arg("file"), py::arg("hyperparameters"), py::arg("out_dir"),
      "`crucible import mace FILE [--hyperparameters JSON] --out OUT_DIR` (issue 46): returns what it printed. "
      "Raises RuntimeError naming the file for input it cannot use.");
  crucible::python::bind_training(m);
  crucible::python::bind_parts(m);
  // The LibTorch this module was built against (crucible/_build.py holds
  // the same for the check before import).
  m.attr("_libtorch_version") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  m.def("empty_cache", &crucible::empty_large_block_cache,
        "Returns the idle large blocks (16 MiB or more) that loading a model keeps for the next call to the "
        "kernel, and the number of bytes returned; the next large call page-faults its memory again.");
}
