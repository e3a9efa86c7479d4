#!/usr/bin/python3
"""Issue 17: a trained model in stock Debian LAMMPS through KIM.

Trains a SchNet and a MACE model with the real binary, exports each with
`crucible export kim`, installs it with `kim-api-collections-management
install user` (into a private HOME) and runs Debian's `lmp`:
- bundled TiAl structures (periodic, sheared cells, and one non-periodic
  cluster): energy, forces and per-atom energies equal crucible.Calculator's
  to 1e-8 (eV, eV/Å); the pressure tensor and the per-atom virials summed
  equal the calculator's stress;
- an NVE run gives the same thermo output with `mpirun -np 1` and `-np 2`
  (1e-8 relative) and conserves the total energy (bound below);
- an element the model lacks fails at `kim interactions`; atoms closer than
  the model's minimum distance fail with the model's message; export refuses
  a bad name, a non-empty directory, a model of an unknown format and an
  unknown --dtype;
- `export kim --dtype float32` (issue 19): the same quantities equal the
  float32 calculator's to float32 rounding and differ from float64's;
- a MACE model imported with `crucible import mace` (issue 46) gives MACE's
  own energy (1e-10 relative) and forces (1e-8 eV/Å) in LAMMPS.

Usage: test_lammps_kim.py CRUCIBLE_BINARY BUILD_PYTHON_DIR WORK_DIR
"""
import json
import re
import os
import shutil
import subprocess
import sys
import unittest

BINARY, PYDIR, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
sys.argv = sys.argv[:1]
sys.path.insert(0, PYDIR)

import numpy as np  # noqa: E402
from ase import Atoms  # noqa: E402
from ase.data import atomic_masses, atomic_numbers  # noqa: E402
from ase.io import read  # noqa: E402

import crucible  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIAL = os.path.join(SOURCE, "data", "alloy_TiAl", "TiAl_tutorial.xyz")
SPECIES = ["Al", "Ti"]  # LAMMPS types 1, 2
EV_PER_A3_IN_BAR = 1.6021765e6  # LAMMPS metal units' nktv2p (update.cpp), not CODATA 2018
# |Etot(t) - Etot(0)| per atom allowed over the 200-step (0.2 ps) NVE run.
MAX_NVE_DEVIATION_MEV_PER_ATOM = 1.0

ENV = dict(os.environ, HOME=os.path.join(WORK, "home"), OMP_NUM_THREADS="1",
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def run(cmd, check=True, cwd=None):
    p = subprocess.run(cmd, env=ENV, cwd=cwd or WORK, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def install(rundir, name, *export_args):
    out = os.path.join(WORK, name)
    run([BINARY, "export", "kim", rundir, "--name", name, "--out", out, *export_args])
    run(["kim-api-collections-management", "install", "user", out])


def train_and_install(name, *overrides):
    """Trains, then installs the KIM model NAME (float64) and NAME_f32."""
    rundir = os.path.join(WORK, name + "_run")
    run([BINARY, "train", "output.run_dir=" + rundir, "output.overwrite=true", "training.dtype=float64", *overrides])
    install(rundir, name)
    install(rundir, name + "_f32", "--dtype", "float32")
    return rundir


def setUpModule():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "home"))
    global SCHNET, MACE
    SCHNET = train_and_install("TiAl_SchNet", "training.num_epochs=4", "model.cutoff=4.0",
                               "model.schnet.num_interactions=2")
    MACE = train_and_install("TiAl_MACE", "training.num_epochs=1", "model.type=mace", "model.cutoff=4.0",
                             "model.mace.hidden_irreps=8x0e+8x1o", "model.mace.max_ell=2",
                             "model.mace.radial_mlp=[16]")


def lammps_frame(atoms):
    """The same structure with LAMMPS's cell (a along x, b in the xy plane)
    and positions wrapped into it, so the data file and the calculator see
    the same numbers."""
    a, b, c = atoms.cell[:]
    ax = np.linalg.norm(a)
    bx = b @ a / ax
    by = np.sqrt(b @ b - bx * bx)
    cx = c @ a / ax
    cy = (b @ c - bx * cx) / by
    cz = np.sqrt(c @ c - cx * cx - cy * cy)
    cell = np.array([[ax, 0, 0], [bx, by, 0], [cx, cy, cz]])
    frac = np.linalg.solve(atoms.cell[:].T, atoms.positions.T).T % 1.0
    return Atoms(atoms.get_chemical_symbols(), positions=frac @ cell, cell=cell, pbc=atoms.pbc)


def write_data(path, atoms):
    pos = atoms.positions
    if atoms.pbc.all():
        (ax, _, _), (bx, by, _), (cx, cy, cz) = atoms.cell[:]
        lo, hi, tilt = np.zeros(3), np.array([ax, by, cz]), (bx, cx, cy)
    else:  # a box around the cluster
        lo, hi, tilt = pos.min(0) - 10.0, pos.max(0) + 10.0, None
    lines = ["crucible test structure", "", f"{len(atoms)} atoms", f"{len(SPECIES)} atom types", ""]
    for k, ax_name in enumerate("xyz"):
        lines.append(f"{lo[k]:.17g} {hi[k]:.17g} {ax_name}lo {ax_name}hi")
    if tilt is not None:
        lines.append(f"{tilt[0]:.17g} {tilt[1]:.17g} {tilt[2]:.17g} xy xz yz")
    lines += ["", "Atoms # atomic", ""]
    for i, (s, r) in enumerate(zip(atoms.get_chemical_symbols(), pos)):
        lines.append(f"{i + 1} {SPECIES.index(s) + 1} {r[0]:.17g} {r[1]:.17g} {r[2]:.17g}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def header(name, data, periodic, elements="Al Ti"):
    masses = "\n".join(f"mass {k + 1} {atomic_masses[atomic_numbers[s]]}" for k, s in enumerate(SPECIES))
    return (f"kim init {name} metal\nboundary {'p p p' if periodic else 'f f f'}\nread_data {data}\n"
            f"kim interactions {elements}\n{masses}\nneighbor 1.0 bin\n")


def thermo_table(log):
    """Rows of the thermo output of a LAMMPS log, as floats."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["Step"])
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("Loop time"):
            break
        rows.append([float(x) for x in line.split()])
    return lines[start].split(), np.array(rows)


class SinglePoints(unittest.TestCase):
    def single_point(self, name, rundir, atoms, tag, dtype="float64", tol=1e-8):
        """LAMMPS/KIM against crucible.Calculator(rundir, dtype) to `tol`
        (eV, eV/Å; the stress relative); returns LAMMPS's energy, forces."""
        periodic = bool(atoms.pbc.all())
        data, dump = os.path.join(WORK, tag + ".data"), os.path.join(WORK, tag + ".dump")
        write_data(data, atoms)
        script = header(name, data, periodic) + (
            "compute pe all pe/atom\ncompute sa all stress/atom NULL virial\ncompute p all pressure NULL virial\n"
            "thermo_style custom step pe c_p[1] c_p[2] c_p[3] c_p[4] c_p[5] c_p[6]\n"
            "thermo_modify format float %.17g\n"
            f"dump d all custom 1 {dump} id fx fy fz c_pe c_sa[1] c_sa[2] c_sa[3] c_sa[4] c_sa[5] c_sa[6]\n"
            "dump_modify d format float %.17g sort id\nrun 0\n")
        with open(os.path.join(WORK, tag + ".in"), "w") as f:
            f.write(script)
        p = run(["lmp", "-in", tag + ".in", "-log", tag + ".log"])
        _, thermo = thermo_table(p.stdout)
        d = np.loadtxt(dump, skiprows=9, ndmin=2)

        calc = crucible.Calculator(rundir, dtype=dtype)
        atoms = atoms.copy()
        atoms.calc = calc
        e, f, ea = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_potential_energies()
        # The calculator sums float32 per-atom energies in float32, the KIM
        # driver in float64: allow float32 rounding of that sum.
        e_tol = tol + (2e-7 * np.abs(ea).sum() if dtype == "float32" else 0.0)
        self.assertLess(abs(thermo[0, 1] - e), e_tol, f"energy ({e:.6f} eV, {len(atoms)} atoms)")
        self.assertLess(np.abs(d[:, 1:4] - f).max(), tol, "forces")
        self.assertLess(np.abs(d[:, 4] - ea).max(), tol, "per-atom energies")
        # Per-atom virials (LAMMPS order xx yy zz xy xz yz) sum to the virial.
        virial = d[:, 5:11].sum(0) / EV_PER_A3_IN_BAR  # eV: -(W) in LAMMPS's sign, = stress x volume
        if periodic:
            s = atoms.get_stress(voigt=False)  # eV/Å^3, ASE sign
            expected = np.array([s[0, 0], s[1, 1], s[2, 2], s[0, 1], s[0, 2], s[1, 2]])
            scale = max(1e-3, np.abs(expected).max())
            self.assertLess(np.abs(virial / atoms.get_volume() - expected).max(), tol * scale, "stress/atom sum")
            # compute pressure (bar) is minus the stress.
            self.assertLess(np.abs(-thermo[0, 2:8] / EV_PER_A3_IN_BAR - expected).max(), tol * scale, "pressure")
        else:  # a cluster: stress × volume is -Σ r ⊗ F
            w = -(atoms.positions[:, :, None] * f[:, None, :]).sum(0)
            expected = np.array([w[0, 0], w[1, 1], w[2, 2], w[0, 1], w[0, 2], w[1, 2]])
            self.assertLess(np.abs(virial - expected).max(), tol * max(1.0, np.abs(expected).max()), "virial")
        return thermo[0, 1], d[:, 1:4]

    def test_bundled_structures_equal_the_calculator(self):
        frames = read(TIAL, index=":")
        chosen = [0, 7, 100] + [i for i, a in enumerate(frames) if len(a) > 2][:1]
        for name, rundir in (("TiAl_SchNet", SCHNET), ("TiAl_MACE", MACE)):
            for i in chosen:
                with self.subTest(model=name, frame=i):
                    self.single_point(name, rundir, lammps_frame(frames[i]), f"{name}_frame{i}")
            cluster = lammps_frame(frames[0].repeat((2, 2, 2)))
            cluster.pbc = False
            with self.subTest(model=name, frame="cluster"):
                self.single_point(name, rundir, cluster, f"{name}_cluster")

    def test_imported_mace_model_gives_maces_predictions_in_lammps(self):
        """Issue 46: MACE's TiAl fixture model, imported (.pt + JSON) and
        exported to KIM: LAMMPS gives MACE's own energy and forces."""
        import gzip
        fixtures = os.path.join(SOURCE, "tests", "models", "fixtures", "mace")
        pt = os.path.join(WORK, "tial_mace.pt")
        with gzip.open(os.path.join(fixtures, "tial_16x0e16x1o16x2e.pt.gz"), "rb") as f, open(pt, "wb") as g:
            g.write(f.read())
        rundir = os.path.join(WORK, "tial_mace_imported")
        shutil.rmtree(rundir, ignore_errors=True)
        run([BINARY, "import", "mace", pt, "--hyperparameters", os.path.join(fixtures, "tial_16x0e16x1o16x2e.json"),
             "--out", rundir])
        install(rundir, "TiAl_MACE_imported")
        refs = read(os.path.join(fixtures, "tial_16x0e16x1o16x2e_reference.extxyz"), index=":")
        ref = refs[4]  # 128 atoms, periodic
        atoms = lammps_frame(ref)
        energy, forces = self.single_point("TiAl_MACE_imported", rundir, atoms, "imported_mace")
        # lammps_frame rotates the cell: rotate MACE's forces the same way.
        rotation = np.linalg.solve(ref.cell[:], atoms.cell[:])
        self.assertLess(abs(energy - ref.info["mace_energy"]), 1e-10 * abs(ref.info["mace_energy"]))
        self.assertLess(np.abs(forces - ref.arrays["mace_forces"] @ rotation).max(), 1e-8)

    def test_float32_export_equals_the_float32_calculator(self):
        atoms = lammps_frame(read(TIAL, index=0).repeat((2, 2, 2)))
        atoms.rattle(0.05, seed=5)
        atoms = lammps_frame(atoms)
        for name, rundir in (("TiAl_SchNet", SCHNET), ("TiAl_MACE", MACE)):
            with self.subTest(model=name):
                with open(os.path.join(WORK, name + "_f32", "model", "settings.json")) as f:
                    self.assertEqual(json.load(f), {"dtype": "float32"})
                # float32 rounding: ~1e-7 relative per atom and layer.
                e32, f32 = self.single_point(name + "_f32", rundir, atoms, f"{name}_f32", dtype="float32", tol=1e-4)
                e64, f64 = self.single_point(name, rundir, atoms, f"{name}_f64")
                # Evaluated in float32 indeed: not float64's numbers, but close.
                self.assertGreater(abs(e32 - e64) + np.abs(f32 - f64).max(), 1e-12)
                self.assertLess(abs(e32 - e64), 1e-4 * len(atoms))
                self.assertLess(np.abs(f32 - f64).max(), 1e-4)


class Dynamics(unittest.TestCase):
    def test_nve_same_thermo_with_one_and_two_processes_and_conserves_energy(self):
        atoms = lammps_frame(read(TIAL, index=0).repeat((2, 2, 2)))
        atoms.rattle(0.03, seed=3)
        atoms = lammps_frame(atoms)
        data = os.path.join(WORK, "nve.data")
        write_data(data, atoms)
        script = header("TiAl_SchNet", data, True) + (
            "velocity all create 300.0 4928 mom yes rot no dist gaussian\ntimestep 0.001\nfix 1 all nve\n"
            "thermo_style custom step temp pe ke etotal press pxx pyy pzz\nthermo_modify format float %.17g\n"
            "thermo 20\nrun 200\n")
        with open(os.path.join(WORK, "nve.in"), "w") as f:
            f.write(script)
        tables = {}
        for np_ in (1, 2):
            p = run(["mpirun", "-np", str(np_), "lmp", "-in", "nve.in", "-log", f"nve_np{np_}.log"])
            self.assertIn(f"on {np_} procs", p.stdout)
            names, tables[np_] = thermo_table(p.stdout)
        one, two = tables[1], tables[2]
        self.assertEqual(one.shape, (11, 9))
        rel = np.abs(one - two) / np.maximum(1.0, np.abs(one))
        self.assertLess(rel.max(), 1e-8, f"np 1 vs np 2 thermo ({names})")
        etotal = one[:, names.index("TotEng")]
        deviation = np.abs(etotal - etotal[0]).max() / len(atoms) * 1000
        print(f"NVE 200 x 1 fs, {len(atoms)} atoms: max |Etot - Etot(0)| = {deviation:.4f} meV/atom "
              f"(bound {MAX_NVE_DEVIATION_MEV_PER_ATOM})")
        self.assertLess(deviation, MAX_NVE_DEVIATION_MEV_PER_ATOM)
        self.assertGreater(one[:, names.index("Temp")].max(), 100.0)  # the atoms did move


class Refusals(unittest.TestCase):
    def test_missing_element_fails_at_kim_interactions(self):
        data = os.path.join(WORK, "refuse.data")
        write_data(data, lammps_frame(read(TIAL, index=0)))
        with open(os.path.join(WORK, "missing.in"), "w") as f:
            f.write(header("TiAl_SchNet", data, True, elements="Al Cu") + "run 0\n")
        p = run(["lmp", "-in", "missing.in"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("symbol not found: Cu", p.stdout + p.stderr)

    def test_atoms_closer_than_the_minimum_distance_fail(self):
        atoms = lammps_frame(read(TIAL, index=0).repeat((2, 2, 2)))
        atoms.positions[1] = atoms.positions[0] + [0.05, 0.0, 0.0]
        data = os.path.join(WORK, "close.data")
        write_data(data, atoms)
        with open(os.path.join(WORK, "close.in"), "w") as f:
            f.write(header("TiAl_SchNet", data, True) + "run 0\n")
        p = run(["lmp", "-in", "close.in"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("closer than the model's minimum distance", p.stdout + p.stderr)
        # Issue 48: named by positions a dump shows (not KIM's internal particle numbers alone).
        named = [np.array([float(v) for v in m]) for m in
                 re.findall(r"\((-?[0-9.]+), (-?[0-9.]+), (-?[0-9.]+)\)", p.stdout + p.stderr)]
        self.assertTrue(any(np.abs(r - atoms.positions[k]).max() < 1e-3 for r in named for k in (0, 1)), p.stdout + p.stderr)

    def test_export_refuses_bad_name_existing_directory_and_unknown_format(self):
        p = run([BINARY, "export", "kim", SCHNET, "--name", "9lives", "--out", os.path.join(WORK, "x")], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--name must be a KIM item name", p.stderr)
        taken = os.path.join(WORK, "taken")
        os.makedirs(taken, exist_ok=True)
        with open(os.path.join(taken, "keep.txt"), "w") as f:
            f.write("mine")
        p = run([BINARY, "export", "kim", SCHNET, "--name", "M", "--out", taken], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("must be a new or empty directory", p.stderr)
        self.assertEqual(os.listdir(taken), ["keep.txt"])
        # Issue 47: an empty --out was a raw "filesystem error", exit 2.
        p = run([BINARY, "export", "kim", SCHNET, "--name", "M", "--out", ""], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("export kim --out must name a new or empty directory, got ''", p.stderr)
        # A run directory whose model.json exists but model.pt does not: say so.
        unfinished = os.path.join(WORK, "unfinished_run")
        os.makedirs(unfinished, exist_ok=True)
        shutil.copy(os.path.join(SCHNET, "model.json"), unfinished)
        p = run([BINARY, "export", "kim", unfinished, "--name", "M", "--out", os.path.join(WORK, "u")], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("model weights file does not exist, although", p.stderr)
        self.assertIn("crucible train --resume", p.stderr)
        future = os.path.join(WORK, "future_run")
        shutil.copytree(SCHNET, future, dirs_exist_ok=True)
        with open(os.path.join(future, "model.json")) as f:
            meta = json.load(f)
        meta["version"] = 99
        with open(os.path.join(future, "model.json"), "w") as f:
            json.dump(meta, f)
        p = run([BINARY, "export", "kim", future, "--name", "M", "--out", os.path.join(WORK, "y")], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("model.json", p.stderr)
        self.assertIn("99", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(WORK, "y")))
        p = run([BINARY, "export", "kim", SCHNET, "--name", "M", "--out", os.path.join(WORK, "z"), "--dtype", "float16"],
                check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--dtype", p.stderr)
        self.assertIn("float16", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(WORK, "z")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
