#!/usr/bin/env python3
"""Independent PyTorch/ASE oracle for Crucible's SchNet.

Reads a text dump written by tests/models/test_schnet_oracle.cpp:

    option <name> <value>
    tensor <name> <ndim> <dims...>
    <values, whitespace separated>
    structure <n_atoms> <pbc_a> <pbc_b> <pbc_c>
    <cell 9 values> <positions n*3 values> <atomic numbers n values>

and prints, for every structure, "energy E", "forces f..." (row-major N*3) and
"stress s..." (row-major 3x3, ASE sign; zeros when not periodic), all with 17
significant digits.

The model is re-implemented here from Schütt et al., J. Chem. Phys. 148,
241722 (2018) (schnetpack layout) with torch.nn.functional only; neighbors
come from ase.neighborlist.neighbor_list, forces from torch.autograd and the
stress from ASE's own finite-difference Calculator.calculate_numerical_stress,
so the C++ strain-derivative stress is checked against ASE's definition.
"""
import math
import sys

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import Calculator, all_changes
from ase.neighborlist import neighbor_list

torch.set_default_dtype(torch.float64)


def parse(path):
    tokens = open(path).read().split()
    pos = 0
    options, tensors, structures = {}, {}, []

    def take(n=1):
        nonlocal pos
        out = tokens[pos:pos + n]
        pos += n
        return out

    while pos < len(tokens):
        kind = take()[0]
        if kind == "option":
            name, value = take(2)
            options[name] = float(value)
        elif kind == "tensor":
            name, ndim = take(2)
            dims = [int(x) for x in take(int(ndim))]
            count = int(np.prod(dims)) if dims else 1
            values = np.array([float(x) for x in take(count)])
            tensors[name] = torch.tensor(values).reshape(dims)
        elif kind == "structure":
            n, a, b, c = (int(x) for x in take(4))
            cell = np.array([float(x) for x in take(9)]).reshape(3, 3)
            positions = np.array([float(x) for x in take(3 * n)]).reshape(n, 3)
            numbers = [int(x) for x in take(n)]
            structures.append(Atoms(numbers=numbers, positions=positions, cell=cell,
                                    pbc=[bool(a), bool(b), bool(c)]))
        else:
            raise ValueError(f"unknown record {kind}")
    return options, tensors, structures


def ssp(x):
    return torch.nn.functional.softplus(x) - math.log(2.0)


def linear(t, prefix, x):
    w = t[prefix + ".weight"]
    b = t.get(prefix + ".bias")
    return torch.nn.functional.linear(x, w, b)


def schnet_energy(options, t, atoms, positions, cell):
    """Energy (0-dim tensor) of `atoms` with the given positions/cell tensors."""
    rc = options["cutoff"]
    n_int = int(options["num_interactions"])
    i, j, S = neighbor_list("ijS", atoms, rc)
    i = torch.tensor(i, dtype=torch.long)
    j = torch.tensor(j, dtype=torch.long)
    S = torch.tensor(S, dtype=torch.float64)
    z = torch.tensor(atoms.numbers, dtype=torch.long)
    vec = positions[j] - positions[i] + S @ cell
    d = torch.sqrt((vec ** 2).sum(-1))
    mu = t["offsets"]
    gamma = 0.5 / (rc / (len(mu) - 1)) ** 2  # Δμ from the options, not the (float32-rounded) buffer
    rbf = torch.exp(-gamma * (d[:, None] - mu[None, :]) ** 2)
    fc = 0.5 * (torch.cos(math.pi * d / rc) + 1.0) * (d < rc)
    x = t["embedding.weight"][z]
    for k in range(n_int):
        W = linear(t, f"filter2.{k}", ssp(linear(t, f"filter1.{k}", rbf))) * fc[:, None]
        h = linear(t, f"in2f.{k}", x)
        v = torch.zeros(len(x), h.shape[1]).index_add(0, i, h[j] * W)
        v = linear(t, f"dense.{k}", ssp(linear(t, f"f2out.{k}", v)))
        x = x + v
    y = linear(t, "out2", ssp(linear(t, "out1", x))).squeeze(-1)
    return (t["scale"] * y + t["shift"] + t["e0"][z]).sum()


class OracleCalculator(Calculator):
    implemented_properties = ["energy", "free_energy"]

    def __init__(self, options, tensors):
        super().__init__()
        self.options, self.tensors = options, tensors

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        with torch.no_grad():
            e = schnet_energy(self.options, self.tensors, self.atoms,
                              torch.tensor(self.atoms.positions), torch.tensor(np.array(self.atoms.cell)))
        self.results["energy"] = float(e)
        self.results["free_energy"] = float(e)  # force_consistent=True in ASE


def fmt(values):
    return " ".join(f"{v:.17g}" for v in np.asarray(values).ravel())


def main(path):
    options, tensors, structures = parse(path)
    for atoms in structures:
        positions = torch.tensor(atoms.positions, requires_grad=True)
        energy = schnet_energy(options, tensors, atoms, positions, torch.tensor(np.array(atoms.cell)))
        (grad,) = torch.autograd.grad(energy, positions)
        print("energy", fmt([energy.item()]))
        print("forces", fmt(-grad.numpy()))
        if atoms.pbc.any():
            calc = OracleCalculator(options, tensors)
            atoms.calc = calc
            stress = calc.calculate_numerical_stress(atoms, d=1e-5, voigt=False)
        else:
            stress = np.zeros((3, 3))
        print("stress", fmt(stress))


if __name__ == "__main__":
    main(sys.argv[1])
