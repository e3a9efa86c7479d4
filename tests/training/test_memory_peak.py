#!/usr/bin/env python3
"""Issue 47: the training memory estimate against the measured peak.

`crucible train` prints its estimated peak in the header ("memory     about
X GB at peak (...)"); this test runs it on data written here and reads the
child's peak resident memory from the kernel (os.wait4's ru_maxrss, the
oracle), for the cases where each part of the estimate dominates: SchNet's
activations, SchNet's training state, MACE's activations, many small
structures (the data set) and large cells with many pairs (neighbor lists).
Every estimate must lie within 1.5x of its peak. The batches are alike (one
cell size), so a few steps visit the largest batch the estimate assumes.

Usage: test_memory_peak.py CRUCIBLE WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
from ase.build import bulk
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io import write

CRUCIBLE, WORK = sys.argv[1], sys.argv[2]


def labelled(atoms, rng):
    atoms.calc = SinglePointCalculator(atoms, energy=-3.5 * len(atoms) + rng.normal(0, 0.1),
                                       forces=rng.normal(0, 0.5, (len(atoms), 3)))
    return atoms


def cells(path, repeat, frames):
    rng = np.random.default_rng(0)
    out = []
    for i in range(frames):
        a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
        a.rattle(0.05, seed=i)
        out.append(labelled(a, rng))
    write(path, out)


def waters(path, frames):
    rng = np.random.default_rng(1)
    base = np.array([[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    write(path, [labelled(Atoms("OH2", positions=base + rng.normal(0, 0.05, (3, 3))), rng) for _ in range(frames)])


def peak_and_estimate(name, overrides):
    run = os.path.join(WORK, "run_" + name)
    shutil.rmtree(run, ignore_errors=True)
    args = [CRUCIBLE, "train", "--run-dir", run, "training.num_threads=2"] + overrides
    log = open(os.path.join(WORK, name + ".log"), "w+")
    child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    text = log.read()
    if child.returncode != 0:
        raise SystemExit(f"{name}: crucible train exited {child.returncode}:\n{text[-2000:]}")
    m = re.search(r"^  memory     about ([0-9.]+) GB at peak (.*)$", text, re.M)
    if not m:
        raise SystemExit(f"{name}: the header has no memory line:\n{text[:3000]}")
    return usage.ru_maxrss * 1024, float(m.group(1)) * 1e9, m.group(2)


def main():
    os.makedirs(WORK, exist_ok=True)
    cu64, cu256, water = (os.path.join(WORK, f) for f in ("cu64.xyz", "cu256.xyz", "water.xyz"))
    cells(cu64, (2, 2, 4), 24)
    cells(cu256, (4, 4, 4), 160)
    waters(water, 40000)
    common = ["data.energy_key=energy", "data.forces_key=forces", "training.valid_batch_size=8"]
    schnet = "model.type=schnet"
    cases = {
        "schnet_activations": [f"data.train_file={cu64}", schnet, "model.schnet.hidden_channels=64",
                               "model.schnet.num_filters=256", "model.schnet.num_interactions=3",
                               "training.batch_size=8", "training.num_steps=2"],
        "schnet_state": [f"data.train_file={cu64}", schnet, "model.schnet.hidden_channels=900",
                         "model.schnet.num_filters=900", "model.schnet.num_interactions=1",
                         "training.batch_size=1", "training.num_steps=2"],
        "mace_activations": [f"data.train_file={cu64}", "model.type=mace", "model.mace.hidden_irreps=64x0e+64x1o",
                             "training.batch_size=4", "training.num_steps=2"],
        "many_structures": [f"data.train_file={water}", schnet, "model.schnet.hidden_channels=8",
                            "model.schnet.num_filters=8", "training.batch_size=1", "training.num_steps=1"],
        "many_pairs": [f"data.train_file={cu256}", schnet, "model.cutoff=6.0", "model.schnet.hidden_channels=8",
                       "model.schnet.num_filters=8", "training.batch_size=1", "training.num_steps=1"],
    }
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {cpu}")
    failures = []
    for name, overrides in cases.items():
        peak, estimate, parts = peak_and_estimate(name, common + overrides)
        ratio = estimate / peak
        print(f"{name:20s} peak {peak / 1e9:6.3f} GB  estimate {estimate / 1e9:6.3f} GB  ratio {ratio:4.2f}  {parts}")
        if not 1 / 1.5 <= ratio <= 1.5:
            failures.append(f"{name}: estimate/peak = {ratio:.2f}, must be within [0.67, 1.5]")
    if failures:
        raise SystemExit("\n".join(failures))
    print("every estimate within 1.5x of its measured peak")


if __name__ == "__main__":
    main()
