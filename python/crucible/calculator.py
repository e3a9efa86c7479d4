"""An ASE calculator for any Crucible model (issue 17)."""
import numpy as np
from ase.calculators.calculator import Calculator as _AseCalculator, all_changes
from ase.stress import full_3x3_to_voigt_6_stress


class Calculator(_AseCalculator):
    """ASE calculator: energy, free_energy, forces, stress and per-atom energies.

    Parameters
    ----------
    path : run directory (crucible train), or model.pt / model_last.pt with
        model.json beside it.
    dtype : None (default: the dtype the model was trained in, as
        `crucible evaluate` computes), "float32" or "float64".
        metadata["dtype"] is the dtype it computes in.

    Units: eV, eV/Å, eV/Å^3 (stress with ASE's sign: positive = tensile).
    Loading a model makes LibTorch keep freed CPU blocks of 16 MiB or more
    for reuse in this process (no page faults per MD step on large cells;
    docs/inference_path.md); CRUCIBLE_DEFAULT_MALLOC=1 in the environment
    keeps LibTorch's own allocator.
    Periodic, mixed and non-periodic cells; Crucible's own neighbor list.
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress", "energies"]

    def __init__(self, path, dtype=None, **kwargs):
        super().__init__(**kwargs)
        from . import load_model
        self.model = load_model(path, dtype)
        self.metadata = self.model.metadata()

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        a = self.atoms
        out = self.model.compute(np.ascontiguousarray(a.get_positions(), dtype=float),
                                 np.ascontiguousarray(a.get_atomic_numbers(), dtype=np.int64),
                                 np.ascontiguousarray(np.array(a.get_cell()), dtype=float),
                                 [bool(p) for p in a.get_pbc()],
                                 bool(a.get_pbc().any()))
        self.results["energy"] = out["energy"]
        self.results["free_energy"] = out["energy"]
        self.results["forces"] = out["forces"]
        self.results["energies"] = out["energies"]
        if a.get_pbc().any():
            self.results["stress"] = full_3x3_to_voigt_6_stress(out["stress"])
