"""Crucible from Python: training (issue 49) and models (issue 17).

    import crucible
    run = crucible.train("configs/ethanol.yaml", hooks=[MyHook()])  # crucible.training
    crucible.resume(run.run_dir)                      # an interrupted run, exactly
    crucible.TrainingStrategy(model, spec, ...)       # from parts (crucible.parts)
    calc = crucible.Calculator("runs/default")        # an ASE calculator
    model = crucible.load_model("runs/default")       # metadata and compute()
    crucible.empty_cache()    # the memory kept between calls back to the system
    crucible.import_mace("MACE_compiled.model", "", "runs/mace")   # a MACE model as a run directory

A pickled MACE .model: python3 -m crucible.mace_to_pt MODEL OUT.pt --import RUN_DIR
(needs MACE's Python package).

Put build/python on PYTHONPATH (README). Energies in eV, forces in eV/Å,
stress in eV/Å^3 with ASE's sign convention.
"""
import torch  # first: parameters reach hooks as torch.Tensor through DLPack

from ._build import LIBTORCH_VERSION

# Checked before the extension loads: a second LibTorch in the process is
# not safe to load at all.
if ".".join(torch.__version__.split(".")[:2]) != ".".join(LIBTORCH_VERSION.split(".")[:2]):
    raise ImportError("crucible: this module was built against LibTorch %s, but this Python's torch is %s (%s); "
                      "build it for this Python with: PYTHON=%s bash scripts/build_python.sh"
                      % (LIBTORCH_VERSION, torch.__version__, torch.__file__, __import__("sys").executable))

from ._crucible import Model as _Model  # noqa: E402
from ._crucible import empty_cache  # noqa: E402
from ._crucible import import_mace  # noqa: E402
from .calculator import Calculator  # noqa: E402
from .training import (ConfigError, Context, DataError, Hook, HookError, Run, TrainingError, TrainingStage,
                       TrainingUpdateHook, resume, train)  # noqa: E402
from .parts import DataLoader, Dataset, TrainingStrategy, build_model  # noqa: E402


def load_model(path, dtype=None, exact=False):
    """A trained model from a run directory or a model.pt (or model_last.pt)
    with model.json beside it, computing in `dtype` ("float32", "float64";
    None = the dtype the model was trained in, model.json's "dtype").
    exact=True: a MACE model evaluates its radial MLP, a SchNet model its
    filter network, per pair instead of their splines (the reference path;
    see Calculator).

    Returns an object with .metadata() (type, cutoff, elements, E0s, units, ...)
    and .compute(positions, numbers, cell, pbc, stress=True).
    Raises ValueError / RuntimeError naming the file for a bad model.
    """
    return _Model(str(path), "" if dtype is None else dtype, bool(exact))


__all__ = ["Calculator", "ConfigError", "Context", "DataError", "DataLoader", "Dataset", "Hook", "HookError", "Run",
           "TrainingError", "TrainingStage", "TrainingStrategy", "TrainingUpdateHook", "build_model", "empty_cache",
           "import_mace", "load_model", "resume", "train"]
