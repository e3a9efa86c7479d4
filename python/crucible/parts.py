"""A training strategy from parts (issue 49), as seed 002 assembles one:
datasets, a data loader, a model built from a recipe and its training
data, then a TrainingStrategy of that model with a spec, a loss, validation
data and hooks.

    import crucible
    data = crucible.Dataset("data/alloy_TiAl/TiAl_tutorial.xyz", cutoff=5.0)
    train, valid = data.split(0.1, seed=1)
    model = crucible.build_model(train, {"model": {"type": "schnet", "cutoff": 5.0,
                                                   "schnet": {"hidden_channels": 16}},
                                         "training": {"dtype": "float64"}})
    strategy = crucible.TrainingStrategy(model, {"num_epochs": 2, "optimizer": {"name": "adam", "lr": 5e-3}},
                                         loss={"energy_weight": 1.0, "forces_weight": 10.0},
                                         validation_data=valid, hooks=[MyHook()])
    strategy.run(crucible.DataLoader(train, batch_size=4, shuffle=True, seed=0))
    strategy.validate(); strategy.save_model("runs/parts")   # crucible.Calculator("runs/parts")

Keys are the recipe's (docs/config.md): `data` keys for Dataset, the
`model`, `data.e0s` and `training` (seed, dtype) sections for build_model,
`training.loss` keys for the loss. The spec is TrainingStrategy.to_spec()'s
layout (durations, optimizer with its scheduler, validation cadence,
precision), merged over the defaults key by key.
"""
import json
import os

from . import _crucible
from .training import HookError, _hook_list

__all__ = ["DataLoader", "Dataset", "TrainingStrategy", "build_model"]


class Dataset:
    """Structures of a file (extxyz, DeePMD, ASE .db) with neighbor lists at
    `cutoff` Å; `data` holds recipe data.* keys (energy_key, units, format).
    Raises DataError / ConfigError naming the file or key."""

    def __init__(self, path, cutoff=5.0, data=None, _impl=None):
        self._impl = _impl or _crucible._Dataset(os.fspath(path), float(cutoff),
                                                 json.dumps({"data": data}) if data else "")

    def __len__(self):
        return len(self._impl)

    @property
    def cutoff(self):
        return self._impl.cutoff

    def split(self, valid_fraction, seed=0):
        """(train, valid): a seeded random split, as data.valid_fraction does."""
        a, b = self._impl.split(float(valid_fraction), int(seed))
        return Dataset(None, _impl=a), Dataset(None, _impl=b)


class DataLoader:
    """Batches of a Dataset (shuffled per epoch from `seed` + epoch)."""

    def __init__(self, dataset, batch_size=8, shuffle=True, seed=0):
        self.dataset = dataset  # kept alive with the loader
        self._impl = _crucible._DataLoader(dataset._impl, int(batch_size), bool(shuffle), int(seed))

    def __len__(self):
        return len(self._impl)


def build_model(train, recipe=None):
    """The model.type model of `recipe` (a dict of recipe keys; None = the
    defaults) for the structures of `train`: elements and avg_num_neighbors
    from them, E0s by data.e0s, scale and shift by model.scaling /
    model.shift, initialised from training.seed, in training.dtype.
    model.cutoff must be the dataset's cutoff."""
    return _crucible._Model(train._impl, json.dumps(recipe) if recipe else "")


def _merged(defaults, given):
    """`given` over `defaults`, dicts key by key (an unknown key stays, so
    the spec reader names it)."""
    out = dict(defaults)
    for key, value in given.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    if ("num_epochs" in given) != ("num_steps" in given):  # setting one unsets the other
        out["num_steps" if "num_epochs" in given else "num_epochs"] = None
    return out


class TrainingStrategy:
    """Seed 002's TrainingStrategy of one model ("main") from parts. `spec`:
    a dict in to_spec()'s layout (dtype defaults to the model's); `loss`:
    training.loss keys; hooks:
    crucible.Hook / TrainingUpdateHook objects. run(loader) trains to the
    spec's num_epochs or num_steps (again from where it stopped, with
    counters restored by restore_checkpoint); a hook that raises stops it
    after the batch and run() raises HookError."""

    def __init__(self, model, spec, loss=None, validation_data=None, hooks=(), device="cpu"):
        given = spec
        spec = _merged(json.loads(_crucible._default_spec()), given)
        if "dtype" not in given:
            spec["dtype"] = model.dtype  # train in the dtype build_model made the model in
        if validation_data is None:
            spec["validation"] = None
        self.model = model
        self._loaders = []
        self._impl = _crucible._Strategy(model, json.dumps(spec),
                                         json.dumps({"training": {"loss": loss}}) if loss else "",
                                         validation_data._impl if validation_data is not None else None,
                                         _hook_list(hooks), device)

    def run(self, loader):
        self._loaders.append(loader)  # the C++ loop reads it; keep it alive
        error = self._impl.run(loader._impl)
        if error:
            raise HookError("%s\nThe run stopped after step %d." % (error, self.step_count), None)

    def validate(self):
        """The validation summary (meV units, loss) of validation_data."""
        return self._impl.validate()

    def save_model(self, run_dir):
        """model.pt + model.json in run_dir: crucible.Calculator(run_dir),
        crucible evaluate and crucible export kim take it."""
        os.makedirs(run_dir, exist_ok=True)
        self._impl.save_model(os.fspath(run_dir))

    def to_spec(self):
        return json.loads(self._impl.to_spec())

    def save_checkpoint(self, directory):
        return self._impl.save_checkpoint(os.fspath(directory))

    def restore_checkpoint(self, directory):
        return self._impl.restore_checkpoint(os.fspath(directory))

    def close(self):
        self._impl.close()

    step_count = property(lambda self: self._impl.step_count)
    epoch_count = property(lambda self: self._impl.epoch_count)
    batch_count = property(lambda self: self._impl.batch_count)
    finish_reason = property(lambda self: self._impl.finish_reason)
