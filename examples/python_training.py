#!/usr/bin/python3
"""Train from Python, notebook style (issue 49): crucible.train on the
bundled TiAl data with a hook that records the losses and stops early, the
learning curve with matplotlib, and the model evaluated through its ASE
calculator against the DFT labels of the validation frames.

    PYTHONPATH=build/python /usr/bin/python3 examples/python_training.py [--out runs/python_example]

Each cell below is a step you would run in a notebook.
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")  # files, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from ase.io import read  # noqa: E402

import crucible  # noqa: E402
from crucible import TrainingStage as S  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="runs/python_example", help="run directory (PNG and model go here)")
ap.add_argument("--epochs", type=int, default=15)
ap.add_argument("--patience", type=int, default=2, help="validations without a better forces MAE before stopping")
args = ap.parse_args()


# %% A hook: every batch's loss, every validation's errors, and an early stop.
class LossRecorder(crucible.Hook):
    stages = {S.AFTER_BATCH, S.AFTER_VALIDATION}

    def __init__(self, patience):
        self.patience = patience
        self.steps, self.losses = [], []            # training loss per optimizer step
        self.val_steps, self.val_forces = [], []    # validation forces MAE, meV/Å
        self.best, self.since_best = float("inf"), 0

    def __call__(self, ctx, stage):
        if stage == S.AFTER_BATCH:
            self.steps.append(ctx.step_count)
            self.losses.append(ctx.loss)
            return
        mae = ctx.validation["forces_mae"]
        self.val_steps.append(ctx.step_count)
        self.val_forces.append(mae)
        if mae < self.best:
            self.best, self.since_best = mae, 0
        else:
            self.since_best += 1
            if self.since_best >= self.patience:
                ctx.request_stop(f"no better forces MAE in {self.patience} validations")


# %% Train: the default recipe (SchNet on data/alloy_TiAl), a few epochs.
recorder = LossRecorder(args.patience)
run = crucible.train({"training": {"num_epochs": args.epochs}, "output": {"overwrite": True}},
                     hooks=[recorder], run_dir=args.out)
print(run, "—", run.summary.get("early_stopping", "ran every epoch"))

# %% The learning curve.
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
ax1.semilogy(recorder.steps, recorder.losses, lw=0.6, alpha=0.35, label="batch")
window = 25
if len(recorder.losses) >= window:
    mean = np.convolve(recorder.losses, np.ones(window) / window, mode="valid")
    ax1.semilogy(recorder.steps[window - 1:], mean, lw=1.8, label=f"mean of {window}")
ax1.legend()
ax1.set_xlabel("optimizer step")
ax1.set_ylabel("training loss (batch)")
ax2.plot(recorder.val_steps, recorder.val_forces, "o-")
ax2.set_xlabel("optimizer step")
ax2.set_ylabel("validation forces MAE (meV/Å)")
fig.suptitle("SchNet on TiAl from crucible.train")
fig.tight_layout()
png = os.path.join(run.run_dir, "python_learning_curve.png")
fig.savefig(png, dpi=120)
print("learning curve:", png)

# %% Evaluate with the calculator against DFT (the file's last 20 frames, from
# either split: the run's own validation split is in run.metrics).
calc = run.calculator()
frames = read(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "alloy_TiAl",
                           "TiAl_tutorial.xyz"), index=":")
e_err, f_err = [], []
for atoms in frames[-20:]:
    e_ref, f_ref = atoms.get_potential_energy(), atoms.arrays["force"]  # this file's DFT labels
    atoms.calc = calc
    e_err.append(abs(atoms.get_potential_energy() - e_ref) / len(atoms))
    f_err.append(np.abs(atoms.get_forces() - f_ref).mean())
print(f"last 20 frames of the file through the calculator: energy MAE {1000 * np.mean(e_err):.1f} meV/atom, "
      f"forces MAE {1000 * np.mean(f_err):.1f} meV/Å (run.metrics[-1]: forces MAE "
      f"{run.metrics[-1]['forces_mae']:.1f} meV/Å on its validation split)")
