#!/usr/bin/python3
"""Issue 46, checked against the reference MACE itself (not in CI: it needs
MACE's Python package, e.g. shared/mace_peer's env.sh).

For a MACE .model pickle: python3 -m crucible.mace_to_pt → crucible import
mace → crucible export mace → crucible.mace_to_pt.load_exported builds
MACE's ScaleShiftMACE and load_state_dict(strict=True); then MACE's own
MACECalculator on the exported model, the original pickle, and
crucible.Calculator on the imported run are compared on the fixture
structures. Optionally a fine-tuned run (--tuned RUN_DIR) is exported and
MACE's predictions of it compared with Crucible's.

Usage: mace_peer_check.py CRUCIBLE_BINARY BUILD_PYTHON_DIR MODEL.model REFERENCE.extxyz WORK_DIR [--tuned RUN_DIR]
"""
import argparse
import os
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("binary")
parser.add_argument("pydir")
parser.add_argument("model")
parser.add_argument("reference")
parser.add_argument("work")
parser.add_argument("--tuned")
args = parser.parse_args()
sys.path.insert(0, args.pydir)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from ase.io import read  # noqa: E402
from mace.calculators import MACECalculator  # noqa: E402

import crucible  # noqa: E402
from crucible.mace_to_pt import convert, load_exported  # noqa: E402

os.makedirs(args.work, exist_ok=True)
run = lambda *cmd: subprocess.run(cmd, check=True, capture_output=True, text=True)  # noqa: E731
pt, hp = convert(args.model, os.path.join(args.work, "converted.pt"))
imported = os.path.join(args.work, "imported")
run(args.binary, "import", "mace", pt, "--hyperparameters", hp, "--out", imported)
exported = os.path.join(args.work, "exported.pt")
run(args.binary, "export", "mace", imported, "--out", exported)


def mace_calc(model):
    path = os.path.join(args.work, "mace_model_%d.model" % id(model))
    torch.save(model, path)
    return MACECalculator(model_paths=path, device="cpu", default_dtype="float64")


def compare(name, calc_a, calc_b, frames):
    worst_e = worst_f = 0.0
    for atoms in frames:
        a, b = atoms.copy(), atoms.copy()
        a.calc, b.calc = calc_a, calc_b
        ea, eb = a.get_potential_energy(), b.get_potential_energy()
        worst_e = max(worst_e, abs(ea - eb) / abs(eb))
        worst_f = max(worst_f, np.abs(a.get_forces() - b.get_forces()).max())
    print(f"{name}: energy {worst_e:.2e} relative, forces {worst_f:.2e} eV/Å (max over {len(frames)} structures)")
    return worst_e, worst_f


frames = read(args.reference, index=":")
original = mace_calc(torch.load(args.model, map_location="cpu").double())
back = load_exported(exported)  # strict load
print("load_exported: strict load_state_dict OK,", sum(p.numel() for p in back.parameters()), "parameters")
compare("MACE(exported) vs MACE(original)", mace_calc(back.double()), original, frames)
compare("Crucible(imported) vs MACE(original)", crucible.Calculator(imported, dtype="float64"), original, frames)
if args.tuned:
    tuned_pt = os.path.join(args.work, "tuned.pt")
    if os.path.exists(tuned_pt):
        os.remove(tuned_pt)
        os.remove(os.path.join(args.work, "tuned.json"))
    run(args.binary, "export", "mace", args.tuned, "--out", tuned_pt)
    compare("MACE(exported fine-tuned) vs Crucible(fine-tuned)", mace_calc(load_exported(tuned_pt).double()),
            crucible.Calculator(args.tuned, dtype="float64"), frames)
