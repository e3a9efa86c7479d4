"""Training from Python (issue 49): the C++ training loop with Python hooks.

    import crucible

    class StopWhenGood(crucible.Hook):
        stages = {crucible.TrainingStage.AFTER_VALIDATION}

        def __call__(self, ctx, stage):
            if ctx.validation["forces_mae"] < 80.0:          # meV/Å
                ctx.request_stop("forces MAE below 80 meV/Å")

    run = crucible.train({"training": {"num_epochs": 20}}, hooks=[StopWhenGood()],
                         run_dir="runs/notebook")
    run.metrics[-1]["forces_mae"], run.summary["steps"]
    calc = run.calculator()                                    # an ASE calculator

The recipe is the one `crucible train` reads (docs/config.md): a YAML path,
a dict of the same keys, or None for the defaults; `overrides` are
"key=value" strings as on the command line. The run directory holds what
`crucible train` writes (config.yaml, checkpoints/, metrics.jsonl,
metrics.csv, learning_curve.svg, model.pt, model.json, summary.json).

Hooks run inside the C++ loop with the GIL taken for their call only.
Ctrl-C stops the run after the current batch with a checkpoint (as on the
command line) and raises KeyboardInterrupt; a hook that raises stops the
run the same way and crucible.train raises HookError with the hook's
traceback. Both leave the run directory resumable: crucible.resume(run_dir).
"""
import json
import os

from . import _crucible
from ._crucible import ConfigError, Context, DataError, TrainingError, TrainingStage

__all__ = ["ConfigError", "Context", "DataError", "Hook", "HookError", "Run", "TrainingError",
           "TrainingStage", "TrainingUpdateHook", "resume", "train"]


class HookError(RuntimeError):
    """A Python hook raised during a run. The message holds its traceback;
    `run` is the Run (stopped after that batch, with a checkpoint)."""

    def __init__(self, message, run):
        super().__init__(message)
        self.run = run


class Hook:
    """A hook on the training loop (seed 002). Subclass it, set `stages` (a
    set of TrainingStage values) and define __call__(self, ctx, stage).
    `frequency` = n runs it every n optimizer steps (default 1). `ctx`
    (crucible.Context) is valid during the call only. DO_BACKWARD and
    DO_OPTIMIZER_STEP belong to update hooks (TrainingUpdateHook)."""

    stages = frozenset()
    frequency = 1

    def __call__(self, ctx, stage):
        raise NotImplementedError("a crucible.Hook subclass defines __call__(self, ctx, stage)")


class TrainingUpdateHook:
    """A hook on the training update (seed 001), run by the orchestrator in
    `priority` order with the built-in ones (10 gradient accumulation, 20
    mixed precision, 30 clipping, 40 spike skipping, 50 default). `stages`
    (default: all of SETUP, BEFORE_BATCH, DO_BACKWARD, DO_OPTIMIZER_STEP,
    AFTER_OPTIMIZER_STEP) are the stages it claims. __call__(self, ctx,
    stage, will_skip) returns True (or None) to proceed and False to veto:
    at BEFORE_BATCH the gradients are then not zeroed, at DO_OPTIMIZER_STEP
    the optimizer (and its scheduler) does not step. `will_skip` says an
    earlier hook already vetoed. A (bool, None) tuple is taken as the seed
    writes it; a transformed loss cannot be returned from Python."""

    priority = 50
    stages = None  # every update stage

    def __call__(self, ctx, stage, will_skip):
        return True


def _hook_list(hooks):
    out = []
    for h in hooks:
        if isinstance(h, TrainingUpdateHook):
            out.append(("update", h))
        elif isinstance(h, Hook) or (callable(h) and hasattr(h, "stages")):
            out.append(("hook", h))
        else:
            raise TypeError("hooks must be crucible.Hook or crucible.TrainingUpdateHook objects, got %r" % (h,))
    return out


class Run:
    """A run directory written by crucible.train / crucible.resume."""

    def __init__(self, result):
        self.run_dir = result["run_dir"]
        self.stopped = result["stopped"]  # stopped before its end (Ctrl-C, SIGTERM, a raising hook)
        self.steps = result["steps"]
        self.epochs = result["epochs"]

    def _jsonl(self, kind):
        path = os.path.join(self.run_dir, "metrics.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        return [r for r in records if r.get("type") == kind]

    @property
    def metrics(self):
        """The validation records of metrics.jsonl, oldest first (dicts: step,
        epoch, energy_mae in meV/atom, forces_mae in meV/Å, ..., loss)."""
        return self._jsonl("validation")

    @property
    def train_records(self):
        """The training records of metrics.jsonl (loss, its terms, lr)."""
        return self._jsonl("train")

    @property
    def summary(self):
        """summary.json as a dict; None for a run that did not finish."""
        path = os.path.join(self.run_dir, "summary.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def calculator(self, **kwargs):
        """An ASE calculator of the run's model.pt (crucible.Calculator)."""
        from .calculator import Calculator
        return Calculator(self.run_dir, **kwargs)

    def __repr__(self):
        return "crucible.Run(%r, steps=%d, epochs=%d%s)" % (self.run_dir, self.steps, self.epochs,
                                                           ", stopped" if self.stopped else "")


def _finish(result):
    run = Run(result)
    if result["hook_error"]:
        if result["stopped"]:
            after = ("The run stopped after step %d with a checkpoint; continue it with crucible.resume(%r)"
                     % (run.steps, run.run_dir))
        else:  # raised after the last batch (AFTER_TRAINING, the final validation): the run finished
            after = "The run had finished; its run directory %s is complete." % run.run_dir
        raise HookError("%s\n%s" % (result["hook_error"], after), run)
    if result["stopped"] and result["signal"]:
        raise KeyboardInterrupt("training stopped by signal %d after step %d with a checkpoint; continue "
                                "it with crucible.resume(%r)" % (result["signal"], run.steps, run.run_dir))
    return run


def train(config=None, overrides=(), hooks=(), run_dir=None):
    """Runs a training recipe in this process and returns its Run.

    config: a YAML file (str or os.PathLike; configs/... falls back to the
    source tree as on the command line), a dict of recipe keys, or None for
    the defaults. overrides: "key=value" strings applied last. hooks:
    crucible.Hook / crucible.TrainingUpdateHook objects, registered after
    the configured update hooks. run_dir: output.run_dir (default: the
    recipe's, else runs/<timestamp>).
    Raises ConfigError / DataError (ValueError) for a bad recipe or data,
    naming the key or file; TrainingError for a run that cannot go on
    (non-finite loss); HookError when a hook raised; KeyboardInterrupt after
    Ctrl-C. The last three leave the run directory resumable.
    """
    if config is None:
        text, path = "", ""
    elif isinstance(config, dict):
        text, path = json.dumps(config), ""
    elif isinstance(config, (str, os.PathLike)):
        text, path = "", os.fspath(config)
    else:
        raise TypeError("config must be a YAML path, a dict or None, got %r" % (config,))
    if isinstance(overrides, str):
        overrides = [overrides]
    return _finish(_crucible._train(text, path, list(overrides), _hook_list(hooks),
                                    None if run_dir is None else os.fspath(run_dir)))


def resume(run_dir, hooks=(), checkpoint=None):
    """Continues an unfinished run (crucible train --resume RUN_DIR) at the
    exact next batch from its newest intact checkpoint (or `checkpoint`),
    with `hooks`. Raises as train()."""
    return _finish(_crucible._resume(os.fspath(run_dir), _hook_list(hooks), checkpoint))
