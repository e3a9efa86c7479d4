"""An ASE calculator for any Crucible model (issue 17)."""
import numpy as np
from ase.calculators.calculator import Calculator as _AseCalculator, PropertyNotImplementedError, all_changes
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
    exact : False (default): a MACE model evaluates its radial MLP, a
        SchNet model its filter network, as splines of the distance (the
        inference engine, issue 48; relative error below 1e-7 in energies
        and 1e-6 in forces, printed by `crucible info`); True: the network
        itself per pair (the reference path).

    Units: eV, eV/Å, eV/Å^3 (stress with ASE's sign: positive = tensile).
    Stress is computed only when ASE asks for it, and only for a periodic
    cell of non-zero volume; otherwise asking raises
    PropertyNotImplementedError (a slab whose c vector is zero has none).
    Loading a model makes LibTorch keep freed CPU blocks of 16 MiB or more
    for reuse in this process (no page faults per MD step on large cells;
    docs/inference_path.md); CRUCIBLE_DEFAULT_MALLOC=1 in the environment
    keeps LibTorch's own allocator.
    Periodic, mixed and non-periodic cells; Crucible's own neighbor list.
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress", "energies"]

    def __init__(self, path, dtype=None, exact=False, **kwargs):
        super().__init__(**kwargs)
        from . import load_model
        self.model = load_model(path, dtype, exact)
        self.metadata = self.model.metadata()

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        a = self.atoms
        want_stress = "stress" in properties
        if want_stress and not (a.get_pbc().any() and a.cell.volume > 0):
            # Issue 47: stress = -virial / volume is undefined without a volume.
            raise PropertyNotImplementedError(
                "stress needs a periodic cell of non-zero volume (stress = -virial / volume), got pbc "
                f"{a.get_pbc().tolist()} and volume {a.cell.volume:g} Å^3; ask for energy and forces only")
        out = self.model.compute(np.ascontiguousarray(a.get_positions(), dtype=float),
                                 np.ascontiguousarray(a.get_atomic_numbers(), dtype=np.int64),
                                 np.ascontiguousarray(np.array(a.get_cell()), dtype=float),
                                 [bool(p) for p in a.get_pbc()],
                                 want_stress)
        self.results["energy"] = out["energy"]
        self.results["free_energy"] = out["energy"]
        self.results["forces"] = out["forces"]
        self.results["energies"] = out["energies"]
        if out["stress"] is not None:  # computed only when ASE asks for it
            self.results["stress"] = full_3x3_to_voigt_6_stress(out["stress"])
