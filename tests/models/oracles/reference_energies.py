#!/usr/bin/env python3
"""Oracle for fit_reference_energies: MACE-style least-squares E0s.

Reads an extxyz file with ASE, builds the [S, n_elements] count matrix of the
frames that have an energy and solves it with numpy.linalg.lstsq (rcond=None),
as mace.data.utils.compute_average_E0s does. Prints "Z E0" lines (17 digits).

Usage: reference_energies.py FILE.xyz
"""
import sys

import numpy as np
from ase.io import read


def main(path):
    frames = read(path, index=":")
    rows, energies = [], []
    for atoms in frames:
        energy = atoms.info.get("energy")
        if energy is None and atoms.calc is not None:
            energy = atoms.calc.results.get("energy")
        if energy is None:
            continue
        rows.append(atoms.get_atomic_numbers())
        energies.append(float(energy))
    zs = sorted({int(z) for r in rows for z in r})
    counts = np.array([[np.count_nonzero(r == z) for z in zs] for r in rows], dtype=float)
    e0, *_ = np.linalg.lstsq(counts, np.array(energies), rcond=None)
    for z, e in zip(zs, e0):
        print(f"{z} {e:.17g}")


if __name__ == "__main__":
    main(sys.argv[1])
