#!/usr/bin/env python3
"""Reference neighbor lists from ASE for tests/neighbors/test_neighbor_list.cpp.

Generates seeded random triclinic structures (every pbc combination, atoms
inside and outside the cell, cutoffs up to twice the shortest cell height)
plus a few hand-made cases, runs ``ase.neighborlist.neighbor_list("ijS")`` on
each, and writes one JSON file:

    {"cases": [{"name", "positions" [N][3], "cell" [3][3], "pbc" [3],
                "cutoff", "i" [E], "j" [E], "S" [E][3]}, ...]}

Edges are sorted by (i, j, S0, S1, S2). Cases where some pair distance lies
within 1e-6 Å of the cutoff are rejected and redrawn, so floating-point ties
cannot make the comparison flaky. Floats are written with repr (round-trip
exact).

Usage: ase_neighbor_cases.py --out FILE [--seed 1234] [--ncases 64]
Must run with a Python that has python3-ase (/usr/bin/python3 on Debian).
"""
import argparse
import json

import numpy as np
from ase import Atoms
from ase.build import bulk, molecule
from ase.geometry import cellpar_to_cell
from ase.neighborlist import neighbor_list

TIE_MARGIN = 1e-6


def heights(cell):
    """Distances between opposite faces of the cell (rows = lattice vectors)."""
    rec = np.linalg.inv(cell).T
    return 1.0 / np.linalg.norm(rec, axis=1)


def random_rotation(rng):
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def random_cell(rng):
    while True:
        lengths = rng.uniform(2.5, 7.0, size=3)
        angles = rng.uniform(55.0, 125.0, size=3)
        try:
            cell = cellpar_to_cell(np.concatenate([lengths, angles]))
        except Exception:
            continue
        if not np.all(np.isfinite(cell)):
            continue
        vol = abs(np.linalg.det(cell))
        if vol > 0.35 * np.prod(lengths):
            return cell @ random_rotation(rng).T


def has_tie(atoms, cutoff):
    d = neighbor_list("d", atoms, cutoff + 2 * TIE_MARGIN)
    return bool(np.any(np.abs(d - cutoff) < TIE_MARGIN))


def reference(name, positions, cell, pbc, cutoff):
    atoms = Atoms(positions=positions, cell=cell, pbc=pbc)
    i, j, S = neighbor_list("ijS", atoms, cutoff)
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    return {
        "name": name,
        "positions": np.asarray(positions, dtype=float).tolist(),
        "cell": np.asarray(cell, dtype=float).tolist(),
        "pbc": [bool(p) for p in pbc],
        "cutoff": float(cutoff),
        "i": i[order].tolist(),
        "j": j[order].tolist(),
        "S": S[order].tolist(),
    }


def random_case(rng, k):
    pbc = [bool((k >> c) & 1) for c in range(3)]
    while True:
        full = random_cell(rng)
        n = int(rng.integers(1, 25))
        frac = rng.uniform(-0.5, 1.5, size=(n, 3))
        # A few atoms far outside the cell (several lattice vectors away).
        far = rng.random(n) < 0.2
        frac[far] += rng.integers(-4, 5, size=(int(far.sum()), 3))
        positions = frac @ full
        cell = full.copy()
        # Non-periodic lattice vectors are irrelevant: sometimes zero them.
        if rng.random() < 0.35:
            for c in range(3):
                if not pbc[c]:
                    cell[c] = 0.0
        h = heights(full)
        hmin = h[np.array(pbc)].min() if any(pbc) else h.min()
        cutoff = float(hmin * rng.uniform(0.2, 2.0))
        atoms = Atoms(positions=positions, cell=cell, pbc=pbc)
        if has_tie(atoms, cutoff):
            continue
        tag = "".join("T" if p else "F" for p in pbc)
        return reference(f"random_{k}_{tag}", positions, cell, pbc, cutoff)


def special_cases(rng):
    out = []
    # Isolated molecule: no cell at all.
    mol = molecule("CH3CH2OH")
    for cutoff in (1.5, 5.0):
        assert not has_tie(mol, cutoff)
        out.append(reference(f"ethanol_no_cell_{cutoff}", mol.positions, np.zeros((3, 3)),
                             [False] * 3, cutoff))
    # Rattled fcc Cu supercell, atoms translated out of the cell.
    cu = bulk("Cu", "fcc", a=3.6).repeat((2, 2, 2))
    cu.rattle(0.1, seed=int(rng.integers(1 << 30)))
    pos = cu.positions + rng.integers(-2, 3, size=(len(cu), 3)) @ cu.cell.array
    for cutoff in (3.0, 5.5, 9.0):
        assert not has_tie(Atoms(positions=pos, cell=cu.cell, pbc=True), cutoff)
        out.append(reference(f"cu_fcc_{cutoff}", pos, cu.cell.array, [True] * 3, cutoff))
    # Slab: periodic in a, b, zero c vector, atoms spread in z.
    ab = random_cell(rng)
    n = 10
    pos = rng.uniform(0, 1, size=(n, 3)) @ ab
    pos[:, 2] = rng.uniform(-8, 8, size=n)
    cell = ab.copy()
    cell[2] = 0.0
    cutoff = 6.0
    assert not has_tie(Atoms(positions=pos, cell=cell, pbc=[True, True, False]), cutoff)
    out.append(reference("slab_zero_c", pos, cell, [True, True, False], cutoff))
    # Single atom, cutoff several times the cell: images of itself only.
    cell = random_cell(rng)
    cutoff = 2.6 * heights(cell).min()
    assert not has_tie(Atoms(positions=[[0.3, -0.2, 0.1]], cell=cell, pbc=True), cutoff)
    out.append(reference("single_atom_images", [[0.3, -0.2, 0.1]], cell, [True] * 3, cutoff))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--ncases", type=int, default=64)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    cases = [random_case(rng, k) for k in range(args.ncases)]
    cases += special_cases(rng)
    with open(args.out, "w") as f:
        json.dump({"seed": args.seed, "cases": cases}, f)


if __name__ == "__main__":
    main()
