#!/usr/bin/python3
"""Issue 18: the DeePMD npy and ASE database readers, checked against NumPy
and ASE.

DeePMD:
- Systems written here with NumPy (float64 and float32 arrays, two sets, a
  non-periodic system with `nopbc`, a folder of systems, virials) are read by
  `crucible convert`; the extxyz it writes, read back with ASE, holds
  NumPy's values (stress = -virial / volume).
- The bundled TiAl file converted to DeePMD: NumPy reads Crucible's .npy files
  and finds ASE's values of the original file; converting back gives the
  original values bit for bit.
- Bad input: big-endian and Fortran-order arrays, a truncated file, a missing
  type_map.raw, a .npy file given instead of its system directory.

ASE databases (written here with ase.db): every row's numbers, positions,
cell, pbc, energy, forces, stress and key-value pairs equal ASE's
row.toatoms(); a database Crucible writes is read (and queried) by ASE and
round trips exactly; an energy kept as a key-value pair is read with
data.energy_key; training reads a .db; a non-SQLite file and a database
without ASE's table are refused.

Usage: test_readers.py CRUCIBLE_BINARY WORK_DIR
"""
import os
import shutil
import subprocess
import sys
import unittest

BINARY, WORK = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[:1]

import numpy as np  # noqa: E402
from ase.io import read  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIAL = os.path.join(SOURCE, "data", "alloy_TiAl", "TiAl_tutorial.xyz")


def crucible(*args, check=True):
    p = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"crucible {' '.join(args)} failed: {p.stderr}")
    return p


def write_system(path, type_map, types, sets, nopbc=False):
    os.makedirs(path)
    with open(os.path.join(path, "type_map.raw"), "w") as f:
        f.write("\n".join(type_map) + "\n")
    with open(os.path.join(path, "type.raw"), "w") as f:
        f.write(" ".join(str(t) for t in types) + "\n")
    if nopbc:
        open(os.path.join(path, "nopbc"), "w").close()
    for k, arrays in enumerate(sets):
        d = os.path.join(path, f"set.{k:03d}")
        os.makedirs(d)
        for name, a in arrays.items():
            np.save(os.path.join(d, name + ".npy"), a)


def remove_if_present(path):
    if os.path.exists(path):
        os.remove(path)


def symmetric(m):
    """Virials are symmetric tensors (ASE keeps only their Voigt part)."""
    return 0.5 * (m + np.swapaxes(m, -1, -2))


class Reader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(WORK)
        rng = np.random.default_rng(7)
        cls.natoms = 5
        cls.sets = []
        for nf, dtype in ((3, np.float64), (2, np.float32)):
            box = np.tile((np.eye(3) * 6.0 + rng.normal(0, 0.3, (3, 3))).reshape(1, 9), (nf, 1))
            cls.sets.append({"coord": rng.uniform(0, 6, (nf, cls.natoms * 3)).astype(dtype),
                             "box": box.astype(dtype),
                             "energy": rng.normal(-30, 1, nf).astype(dtype),
                             "force": rng.normal(0, 1, (nf, cls.natoms * 3)).astype(dtype),
                             "virial": symmetric(rng.normal(0, 2, (nf, 3, 3))).reshape(nf, 9).astype(dtype)})
        cls.types = [1, 0, 1, 1, 0]
        root = os.path.join(WORK, "systems")
        write_system(os.path.join(root, "bulk"), ["O", "H"], cls.types, cls.sets)
        cls.molecule = {"coord": rng.uniform(0, 3, (2, 9)), "energy": rng.normal(-10, 1, 2),
                        "force": rng.normal(0, 1, (2, 9))}
        write_system(os.path.join(root, "water"), ["O", "H"], [0, 1, 1], [cls.molecule], nopbc=True)
        cls.root = root

    def test_values_equal_numpy(self):
        out = os.path.join(WORK, "systems.xyz")
        p = crucible("convert", self.root, out)
        self.assertIn("converted 7 structures (energy ", p.stdout)
        frames = read(out, index=":")
        self.assertEqual(len(frames), 7)
        k = 0
        for arrays in self.sets:
            for i in range(len(arrays["coord"])):
                a = frames[k]
                self.assertEqual(a.get_chemical_symbols(), ["H", "O", "H", "H", "O"])
                np.testing.assert_array_equal(a.positions, arrays["coord"][i].astype(np.float64).reshape(-1, 3))
                np.testing.assert_array_equal(a.cell[:], arrays["box"][i].astype(np.float64).reshape(3, 3))
                self.assertTrue(a.pbc.all())
                self.assertEqual(a.get_potential_energy(), float(arrays["energy"][i]))
                np.testing.assert_array_equal(a.get_forces(), arrays["force"][i].astype(np.float64).reshape(-1, 3))
                volume = abs(np.linalg.det(arrays["box"][i].astype(np.float64).reshape(3, 3)))
                expected = -arrays["virial"][i].astype(np.float64).reshape(3, 3) / volume
                np.testing.assert_allclose(a.get_stress(voigt=False), expected, rtol=1e-14, atol=1e-15)
                k += 1
        for i in range(2):
            a = frames[k + i]
            self.assertFalse(a.pbc.any())
            self.assertEqual(a.get_chemical_symbols(), ["O", "H", "H"])
            np.testing.assert_array_equal(a.positions, self.molecule["coord"][i].reshape(-1, 3))
            self.assertEqual(a.get_potential_energy(), self.molecule["energy"][i])

    def test_bundled_tial_round_trip_and_numpy_reads_the_written_files(self):
        dp, back = os.path.join(WORK, "tial_dp"), os.path.join(WORK, "tial_back.xyz")
        crucible("convert", TIAL, dp)
        original = read(TIAL, index=":")
        # Frames grouped by atoms: system_000 holds the first frame's kind.
        system = os.path.join(dp, "system_000")
        types = np.loadtxt(os.path.join(system, "type.raw"), dtype=int).reshape(-1)
        with open(os.path.join(system, "type_map.raw")) as f:
            type_map = f.read().split()
        coord = np.load(os.path.join(system, "set.000", "coord.npy"))
        energy = np.load(os.path.join(system, "set.000", "energy.npy"))
        force = np.load(os.path.join(system, "set.000", "force.npy"))
        virial = np.load(os.path.join(system, "set.000", "virial.npy"))
        same = [a for a in original if a.get_chemical_symbols() == original[0].get_chemical_symbols()]
        self.assertEqual(coord.shape, (len(same), 3 * len(same[0])))
        self.assertEqual([type_map[t] for t in types], same[0].get_chemical_symbols())
        for i, a in enumerate(same):
            np.testing.assert_array_equal(coord[i].reshape(-1, 3), a.positions)
            self.assertEqual(energy[i], a.get_potential_energy())
            np.testing.assert_array_equal(force[i].reshape(-1, 3), a.arrays["force"])  # the file's column
            np.testing.assert_allclose(virial[i].reshape(3, 3), a.info["virial"], rtol=1e-14, atol=1e-14)
        crucible("convert", dp, back)
        again = read(back, index=":")
        self.assertEqual(len(again), len(original))
        # Reorder the originals as the systems group them.
        order = []
        for kind in dict.fromkeys(tuple(a.get_chemical_symbols()) for a in original):
            order += [a for a in original if tuple(a.get_chemical_symbols()) == kind]
        for a, b in zip(order, again):
            np.testing.assert_array_equal(a.positions, b.positions)
            np.testing.assert_array_equal(a.cell[:], b.cell[:])
            self.assertEqual(a.get_potential_energy(), b.get_potential_energy())
            np.testing.assert_array_equal(a.arrays["force"], b.get_forces())
        # DeePMD → extxyz → DeePMD: the same arrays.
        again_dp = os.path.join(WORK, "tial_dp2")
        crucible("convert", back, again_dp)
        def load(root, name):
            return np.load(os.path.join(root, "system_000", "set.000", name + ".npy"))
        for name in ("coord", "box", "energy", "force"):
            np.testing.assert_array_equal(load(dp, name), load(again_dp, name))
        # The virial passes through the stress (-virial / volume): 1-2 ulp.
        np.testing.assert_allclose(load(dp, "virial"), load(again_dp, "virial"), rtol=5e-16, atol=0)

    def test_train_and_evaluate_read_a_deepmd_directory(self):
        dp, run = os.path.join(WORK, "train_dp"), os.path.join(WORK, "run")
        crucible("convert", TIAL, dp)
        p = crucible("train", "data.train_file=" + dp, "training.num_epochs=1", "output.run_dir=" + run)
        self.assertIn("train      296 structures", p.stdout)  # 329 frames, 10% held out
        p = crucible("evaluate", "--model", run, "--data", dp)
        self.assertIn("329 structures", p.stdout)
        p = crucible("evaluate", "--model", run, "--data", dp, "data.format=extxyz", check=False)
        self.assertEqual(p.returncode, 1)

    def test_bad_inputs_name_the_file(self):
        bad = os.path.join(WORK, "bad")

        def refused(name, arrays, expected, type_map=True, **kw):
            path = os.path.join(bad, name)
            write_system(path, ["O", "H"], [0, 1, 1], [arrays], **kw)
            if not type_map:
                os.remove(os.path.join(path, "type_map.raw"))
            p = crucible("convert", path, path + ".xyz", check=False)
            self.assertEqual(p.returncode, 1, p.stdout)
            self.assertIn(expected, p.stderr)
            self.assertFalse(os.path.exists(path + ".xyz"))

        good = {"coord": np.zeros((1, 9)), "energy": np.zeros(1)}
        refused("big_endian", {"coord": np.zeros((1, 9), dtype=">f8")}, "must be little-endian, got big-endian '>f8'",
                nopbc=True)
        refused("fortran", {"coord": np.asfortranarray(np.zeros((2, 9)))}, "fortran_order True",
                nopbc=True)
        refused("no_map", good, "needs type_map.raw", type_map=False, nopbc=True)
        refused("no_box", good, "box.npy: missing (periodic systems need box.npy")
        refused("shape", {"coord": np.zeros((1, 6))}, "coord.npy: must have shape [1, 9]", nopbc=True)
        # Issue 47: NaN / inf in binary labels are refused naming the frame.
        force = np.zeros((2, 9))
        force[1, 5] = np.nan
        refused("nan_force", {"coord": np.zeros((2, 9)), "force": force},
                "set.000 frame 1: forces must be finite numbers, got nan (atom 1, component 2)", nopbc=True)
        refused("inf_energy", {"coord": np.zeros((1, 9)), "energy": np.array([np.inf])},
                "set.000 frame 0: energy must be a finite number, got inf", nopbc=True)
        # Issue 47: a shape entry 1e1 was read as 1 and another file was blamed.
        path = os.path.join(bad, "exponent_shape")
        write_system(path, ["O", "H"], [0, 1, 1], [{"coord": np.zeros((10, 9))}], nopbc=True)
        coord = os.path.join(path, "set.000", "coord.npy")
        with open(coord, "rb") as f:
            data = f.read()
        self.assertIn(b"(10, 9)", data)
        with open(coord, "wb") as f:
            f.write(data.replace(b"(10, 9)", b"(1e1,9)"))
        p = crucible("convert", path, path + ".xyz", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(coord + ": .npy shape entries must be non-negative integers, got '1e1'", p.stderr)
        # A system 12 folders deep is found (the search goes 16 levels down).
        deep = os.path.join(bad, "deep", *[f"d{k}" for k in range(12)])
        write_system(deep, ["O", "H"], [0, 1, 1], [{"coord": np.zeros((1, 9)), "energy": np.zeros(1)}], nopbc=True)
        p = crucible("convert", os.path.join(bad, "deep"), os.path.join(WORK, "deep.xyz"))
        self.assertIn("converted 1 structures", p.stdout)
        # Issue 47: a virial of a non-periodic system has no stress: refused, not dropped.
        refused("nopbc_virial", {"coord": np.zeros((1, 9)), "virial": np.ones((1, 9))},
                "a virial needs a periodic cell (stress = -virial / volume)", nopbc=True)
        # A truncated .npy file.
        path = os.path.join(bad, "truncated")
        write_system(path, ["O", "H"], [0, 1, 1], [good], nopbc=True)
        coord = os.path.join(path, "set.000", "coord.npy")
        with open(coord, "rb") as f:
            data = f.read()
        with open(coord, "wb") as f:
            f.write(data[:-8])
        p = crucible("convert", path, path + ".xyz", check=False)
        self.assertIn("truncated or corrupt file", p.stderr)
        # A member file instead of the system directory.
        p = crucible("convert", coord, os.path.join(WORK, "x.xyz"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("is a file of a DeePMD system; give the system directory", p.stderr)
        self.assertIn(path, p.stderr)


class AseDatabase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from ase import Atoms
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.db import connect
        os.makedirs(WORK, exist_ok=True)
        cls.path = os.path.join(WORK, "set.db")
        remove_if_present(cls.path)
        db = connect(cls.path)
        rng = np.random.default_rng(3)
        for k, a in enumerate(read(TIAL, index=":40")):
            b = Atoms(a.numbers, positions=a.positions, cell=a.cell, pbc=a.pbc)
            stress = rng.normal(0, 0.01, 6)
            b.calc = SinglePointCalculator(b, energy=a.info["energy"], forces=a.arrays["force"], stress=stress)
            db.write(b, config_type="bulk" if k % 2 else "strained", index=k, dft_energy=a.info["energy"] + 1.0)
        slab = read(TIAL, index=-1)
        slab.pbc = [True, True, False]
        slab.calc = SinglePointCalculator(slab, energy=-7.0, forces=np.zeros((len(slab), 3)))
        db.write(slab, config_type="slab", dft_energy=-6.0)
        cls.rows = [row for row in connect(cls.path).select()]

    def assert_same_atoms(self, a, b):
        """Numbers, positions, cell, pbc, energy and forces bit for bit."""
        np.testing.assert_array_equal(a.numbers, b.numbers)
        np.testing.assert_array_equal(a.positions, b.positions)
        np.testing.assert_array_equal(a.cell[:], b.cell[:])
        np.testing.assert_array_equal(a.pbc, b.pbc)
        self.assertEqual(a.get_potential_energy(), b.get_potential_energy())
        np.testing.assert_array_equal(a.get_forces(), b.get_forces())

    def test_rows_equal_ase(self):
        out = os.path.join(WORK, "from_db.xyz")
        p = crucible("convert", self.path, out)
        self.assertIn(f"converted {len(self.rows)} structures (energy ", p.stdout)
        frames = read(out, index=":")
        self.assertEqual(len(frames), len(self.rows))
        for a, row in zip(frames, self.rows):
            b = row.toatoms()
            self.assert_same_atoms(a, b)
            if b.pbc.all():
                np.testing.assert_array_equal(a.get_stress(), b.get_stress())
            self.assertEqual(a.info["config_type"], row.config_type)
            if "index" in row.key_value_pairs:
                self.assertEqual(a.info["index"], row.index)

    def test_energy_from_a_key_value_pair_and_training_on_a_database(self):
        out = os.path.join(WORK, "from_db_kv.xyz")
        crucible("convert", self.path, out, "data.energy_key=dft_energy")
        for a, row in zip(read(out, index=":"), self.rows):
            self.assertEqual(a.get_potential_energy(), row.dft_energy)
        run = os.path.join(WORK, "db_run")
        p = crucible("train", "data.train_file=" + self.path, "training.num_epochs=1", "output.run_dir=" + run)
        self.assertIn("train      37 structures", p.stdout)  # 41 rows, 4 held out

    def test_written_databases_are_read_by_ase_and_round_trip_exactly(self):
        from ase.db import connect
        copy = os.path.join(WORK, "copy.db")
        remove_if_present(copy)
        crucible("convert", self.path, copy)  # .db -> .db through Crucible
        again = list(connect(copy).select())
        self.assertEqual(len(again), len(self.rows))
        for a, b in zip(self.rows, again):
            self.assert_same_atoms(a.toatoms(), b.toatoms())
            if a.get("stress") is not None:
                np.testing.assert_array_equal(a.stress, b.stress)
            self.assertEqual(a.key_value_pairs, b.key_value_pairs)
        # ASE's queries work on it (species and key tables).
        self.assertEqual(connect(copy).count(config_type="slab"), 1)
        self.assertEqual(connect(copy).count("Ti"), len(self.rows))
        # The bundled extxyz file as a database: ASE finds the file's values.
        tial = os.path.join(WORK, "tial.db")
        remove_if_present(tial)
        crucible("convert", TIAL, tial)
        for a, row in zip(read(TIAL, index=":"), connect(tial).select()):
            b = row.toatoms()
            np.testing.assert_array_equal(a.positions, b.positions)
            self.assertEqual(a.info["energy"], b.get_potential_energy())
            np.testing.assert_array_equal(a.arrays["force"], b.get_forces())
        p = crucible("convert", TIAL, tial, check=False)  # never overwritten
        self.assertEqual(p.returncode, 1)
        self.assertIn(tial + ": exists; nothing is overwritten", p.stderr)

    def test_non_numeric_and_non_finite_labels_are_refused_naming_the_row(self):
        """Issue 47: SQLite reads a text energy 'abc' as 0.0; NaN forces were accepted."""
        import sqlite3
        from ase import Atoms
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.db import connect
        text = os.path.join(WORK, "text_energy.db")
        remove_if_present(text)
        shutil.copy(self.path, text)
        with sqlite3.connect(text) as con:
            con.execute("UPDATE systems SET energy = 'abc' WHERE id = 3")
        out = os.path.join(WORK, "text_energy.xyz")
        p = crucible("convert", text, out, check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn(text + " id 3: energy must be a number, got text 'abc'", p.stderr)
        self.assertFalse(os.path.exists(out))
        p = crucible("train", "data.train_file=" + text, "training.num_epochs=1",
                     "output.run_dir=" + os.path.join(WORK, "text_run"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("energy must be a number, got text 'abc'", p.stderr)

        nan = os.path.join(WORK, "nan_forces.db")
        remove_if_present(nan)
        db = connect(nan)
        a = read(TIAL, index=0)
        forces = a.arrays["force"].copy()
        forces[1, 1] = np.nan
        b = Atoms(a.numbers, positions=a.positions, cell=a.cell, pbc=a.pbc)
        b.calc = SinglePointCalculator(b, energy=a.info["energy"], forces=forces)
        db.write(b, dft_energy="abc")
        p = crucible("convert", nan, os.path.join(WORK, "nan_forces.xyz"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(nan + " id 1: forces must be finite numbers, got nan (atom 1, component 1)", p.stderr)
        p = crucible("convert", nan, os.path.join(WORK, "kv.xyz"), "data.energy_key=dft_energy", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(nan + ' id 1: key-value pair dft_energy (data.energy_key) must be a number, got "abc"',
                      p.stderr)

    def test_a_wrong_energy_key_names_the_energy_column_and_the_key_value_pair(self):
        """Issue 47: data.energy_key=WRONG used to read no energy and suggest WRONG back."""
        out = os.path.join(WORK, "wrong_key.xyz")
        remove_if_present(out)
        p = crucible("convert", self.path, out, "data.energy_key=WRONG", check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn(f"energy under 'dft_energy' in {len(self.rows)} of {len(self.rows)} frames", p.stderr)
        self.assertIn(f"energy under 'energy' in {len(self.rows)} of {len(self.rows)} frames", p.stderr)
        self.assertIn("set data.energy_key=energy", p.stderr)
        self.assertNotIn("=WRONG", p.stderr)
        self.assertFalse(os.path.exists(out))
        # none: no energy on purpose; forces and stress still arrive.
        p = crucible("convert", self.path, out, "data.energy_key=none")
        frames = read(out, index=":")
        self.assertNotIn("energy", frames[0].calc.results if frames[0].calc else {})
        np.testing.assert_array_equal(frames[0].get_forces(), self.rows[0].toatoms().get_forces())
        self.assertIn(f"(energy 0, forces {len(self.rows)}, stress {len(self.rows) - 1})", p.stdout)

    def test_refuses_what_is_not_an_ase_database(self):
        fake = os.path.join(WORK, "fake.db")
        with open(fake, "w") as f:
            f.write("not sqlite\n")
        p = crucible("convert", fake, fake + ".xyz", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("an ASE database must be an SQLite file", p.stderr)
        import sqlite3
        other = os.path.join(WORK, "other.db")
        remove_if_present(other)
        con = sqlite3.connect(other)
        con.execute("CREATE TABLE t (x INTEGER)")
        con.commit()
        con.close()
        p = crucible("convert", other, other + ".xyz", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("needs the table 'systems'", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
