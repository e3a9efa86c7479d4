#!/usr/bin/env python3
"""ASE oracle for the extxyz reader/writer tests (tests/data/test_extxyz.cpp).

Run with the Python that has python3-ase (CRUCIBLE_PYTHON, /usr/bin/python3).

Subcommands (every one writes a JSON file the C++ test compares against):

  symbols OUT.json
      ase.data.chemical_symbols.
  read XYZ OUT.json
      What ase.io.read(XYZ, index=":") returns, one object per frame (see
      frame_from_atoms). A 'virial' is converted to stress = -virial / volume
      on this side because ASE itself keeps it as an info entry.
  random XYZ OUT.json SEED NFRAMES
      Writes NFRAMES random frames with ase.io.write (random N, triclinic
      cells, every pbc combination incl. none, energy / forces / stress from a
      SinglePointCalculator, extra per-atom columns and info entries that
      change from frame to frame), then dumps what ASE reads back.
  hand XYZ OUT.json SEED NFRAMES
      Writes NFRAMES frames by hand in the spellings people publish (pbc as
      "T T T", [T, T, T], T or absent; Lattice with odd spacing and brackets;
      quoted values with spaces and escapes; 6-value Voigt and 9-value
      stress; virial; Properties columns in any order; species and/or Z;
      CRLF line ends; trailing blank lines) and dumps the ground truth. Every
      frame ASE 3.22 can read (all but 6-value stresses, which it rejects) is
      also read with ASE and checked against the ground truth here.

Frame object: numbers [N], positions [N][3], cell [3][3] (rows = lattice
vectors), pbc [3], energy (or null), forces [N][3] (or null), stress [3][3]
(or null), config_type, weights {config_weight, ...}, info {key: value}.
"""

import io
import json
import random
import sys

import numpy as np
import ase
import ase.io
from ase.calculators.singlepoint import SinglePointCalculator
from ase.data import chemical_symbols

WEIGHT_KEYS = ["config_weight", "config_energy_weight", "config_forces_weight",
               "config_stress_weight"]


def to_jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def voigt_to_3x3(v):
    xx, yy, zz, yz, xz, xy = [float(x) for x in v]
    return [[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]]


def frame_from_atoms(atoms):
    """What ASE read, in the Crucible Structure conventions."""
    results = dict(atoms.calc.results) if atoms.calc is not None else {}
    info = dict(atoms.info)
    frame = {
        "numbers": atoms.numbers.tolist(),
        "positions": atoms.positions.tolist(),
        "cell": atoms.cell.array.tolist(),
        "pbc": [bool(p) for p in atoms.pbc],
        "energy": float(results["energy"]) if "energy" in results else None,
        "forces": None,
        "stress": None,
    }
    if "forces" in results:
        frame["forces"] = np.asarray(results["forces"]).tolist()
    elif "force" in atoms.arrays:
        frame["forces"] = atoms.arrays["force"].tolist()
    if "stress" in results:
        frame["stress"] = voigt_to_3x3(results["stress"])
        info.pop("stress", None)
    elif "virial" in info:
        # ASE keeps the virial as info; Crucible converts it to stress.
        frame["stress"] = (-np.asarray(info.pop("virial")) / atoms.get_volume()).tolist()
    info.pop("energy", None)
    frame["config_type"] = str(info.pop("config_type", "Default"))
    frame["weights"] = {k: float(info.pop(k, 1.0)) for k in WEIGHT_KEYS}
    frame["info"] = {k: to_jsonable(v) for k, v in info.items()}
    return frame


def cmd_read(path, out):
    frames = ase.io.read(path, index=":", format="extxyz")
    with open(out, "w") as f:
        json.dump({"frames": [frame_from_atoms(a) for a in frames]}, f)


def random_cell(rng):
    cell = np.diag(rng.uniform(2.0, 12.0, size=3))
    cell += rng.uniform(-2.0, 2.0, size=(3, 3)) * (1 - np.eye(3))
    return cell


def random_word(rng, n):
    return "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"))
                   for _ in range(n))


def cmd_random(path, out, seed, nframes):
    rng = np.random.default_rng(seed)
    images = []
    pbc_choices = [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)]
    for i in range(nframes):
        n = int(rng.integers(1, 24)) if i % 17 else 1
        numbers = rng.integers(1, 119, size=n)
        atoms = ase.Atoms(numbers=numbers, positions=rng.uniform(-5.0, 15.0, size=(n, 3)))
        pbc = pbc_choices[i % 8]
        if any(pbc) or rng.uniform() < 0.5:
            atoms.cell = random_cell(rng)
        atoms.pbc = pbc
        results = {}
        if rng.uniform() < 0.85:
            results["energy"] = float(rng.normal() * 10 ** rng.uniform(-3, 5))
        if rng.uniform() < 0.75:
            results["forces"] = rng.normal(size=(n, 3)) * 10 ** rng.uniform(-3, 2)
        if rng.uniform() < 0.6:
            results["stress"] = rng.normal(size=6) * 10 ** rng.uniform(-4, 0)
        if rng.uniform() < 0.3:
            atoms.set_tags(rng.integers(0, 5, size=n))
        if rng.uniform() < 0.3:
            atoms.set_initial_magnetic_moments(rng.normal(size=n))
        if rng.uniform() < 0.2:
            atoms.set_momenta(rng.normal(size=(n, 3)))
        if rng.uniform() < 0.7:
            atoms.info["config_type"] = random_word(rng, 6) + (" phase" if rng.uniform() < 0.3 else "")
        if rng.uniform() < 0.3:
            atoms.info["config_weight"] = float(rng.uniform(0.1, 3.0))
        if rng.uniform() < 0.2:
            atoms.info["config_forces_weight"] = float(rng.uniform(0.1, 3.0))
        if rng.uniform() < 0.5:
            atoms.info["comment"] = random_word(rng, 4) + " " + random_word(rng, 5)
        if rng.uniform() < 0.5:
            atoms.info["step"] = int(rng.integers(0, 10000))
        if rng.uniform() < 0.5:
            atoms.info["temperature"] = float(rng.uniform(0, 3000))
        if rng.uniform() < 0.3:
            atoms.info["converged"] = bool(rng.uniform() < 0.5)
        if results:
            atoms.calc = SinglePointCalculator(atoms, **results)
        images.append(atoms)
    ase.io.write(path, images, format="extxyz")
    cmd_read(path, out)


# ---------------------------------------------------------------------------
# Hand-written frames.

def fmt_number(rng, x):
    """One of several spellings; returns (text, value the text denotes)."""
    style = rng.randrange(5)
    if style == 0:
        text = repr(float(x))
    elif style == 1:
        text = "%.17e" % x
    elif style == 2:
        text = "%.10f" % x
    elif style == 3:
        text = "%+.16g" % x
    else:
        text = "%.17g" % x
    return text, float(text)


def fmt_list(rng, values, allow_commas=True):
    """A list of numbers with odd spacing; returns (inner text, values)."""
    seps = [" ", "  ", "\t", " \t "] + ([", ", ","] if allow_commas else [])
    sep_style = rng.randrange(3)
    parts, vals = [], []
    for v in values:
        t, f = fmt_number(rng, v)
        parts.append(t)
        vals.append(f)
    if sep_style == 0:
        inner = " ".join(parts)
    else:
        inner = ""
        for i, p in enumerate(parts):
            inner += p if i == 0 else rng.choice(seps) + p
    pad = rng.choice(["", " ", "  "])
    return pad + inner + pad, vals


def fmt_symmetric(rng, m):
    """A symmetric 3x3 as 9 numbers whose mirrored entries are spelled alike
    (ASE reads 9 values column-major, Crucible row-major)."""
    texts = {}
    for i in range(3):
        for j in range(i, 3):
            texts[(i, j)] = texts[(j, i)] = fmt_number(rng, m[i][j])
    parts = [texts[(i, j)][0] for i in range(3) for j in range(3)]
    vals = [texts[(i, j)][1] for i in range(3) for j in range(3)]
    seps = [" ", "  ", "\t", ", "]
    inner = parts[0] + "".join(rng.choice(seps) + p for p in parts[1:])
    return inner, vals


def quoted(rng, inner, allow_brackets=True):
    q = rng.choice(['"%s"', "'%s'", "{%s}", "[%s]"] if allow_brackets else ['"%s"'])
    return q % inner


def cmd_hand(path, out, seed, nframes):
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    text = []
    expected = []
    ase_readable = []
    for i in range(nframes):
        n = rng.randrange(0, 9) if i % 11 else rng.randrange(1, 3)
        numbers = [rng.randrange(1, 119) for _ in range(n)]
        positions = nrng.uniform(-6, 6, size=(n, 3))
        forces = nrng.normal(size=(n, 3))
        has_lattice = rng.random() < 0.75
        cell = random_cell(nrng) if has_lattice else np.zeros((3, 3))
        header = []
        frame = {"numbers": numbers, "config_type": "Default",
                 "weights": {k: 1.0 for k in WEIGHT_KEYS}, "info": {},
                 "energy": None, "forces": None, "stress": None}
        readable = True

        if has_lattice:
            inner, vals = fmt_list(rng, cell.reshape(-1))
            header.append("Lattice=" + quoted(rng, inner))
            cell = np.array(vals).reshape(3, 3)
        frame["cell"] = cell.tolist()

        pbc_style = rng.randrange(6)
        pbc = [rng.random() < 0.5 for _ in range(3)]
        tf = ["T" if p else "F" for p in pbc]
        if pbc_style == 0:
            header.append('pbc="%s %s %s"' % tuple(tf))
        elif pbc_style == 1:
            header.append("pbc=[%s, %s, %s]" % tuple(tf))
        elif pbc_style == 2:
            pbc = [pbc[0]] * 3
            header.append("pbc=" + ("T" if pbc[0] else "F"))
        else:  # absent: periodic iff a Lattice is given (as ASE)
            pbc = [has_lattice] * 3
        frame["pbc"] = pbc

        # Properties: species and/or Z, pos, forces/force, extras, any order.
        force_name = rng.choice(["forces", "force", None])
        columns = [("pos", "R", 3)]
        species_mode = rng.randrange(4)  # 0,1: species; 2: Z; 3: both
        if species_mode in (0, 1, 3):
            columns.append(("species", "S", 1))
        if species_mode in (2, 3):
            columns.append(("Z", "I", 1))
        if force_name:
            columns.append((force_name, "R", 3))
        if rng.random() < 0.4:
            columns.append(("tags", "I", 1))
        if rng.random() < 0.3:
            columns.append(("charge", "R", 1))
        if rng.random() < 0.3:
            columns.append(("label", "S", 1))
        if rng.random() < 0.2:
            columns.append(("vel", "R", 3))
        rng.shuffle(columns)
        props = ":".join("%s:%s:%d" % c for c in columns)
        header.append("Properties=" + props)

        if rng.random() < 0.85:
            t, e = fmt_number(rng, nrng.normal() * 100)
            sep = rng.choice(["=", " = ", "= ", " ="])
            header.append("energy" + sep + t)
            frame["energy"] = e

        stress_style = rng.randrange(5)
        if stress_style == 1 or (stress_style == 2 and not has_lattice):
            voigt = nrng.normal(size=6) * 0.01
            inner, vals = fmt_list(rng, voigt)
            header.append("stress=" + quoted(rng, inner))
            frame["stress"] = voigt_to_3x3(vals)
            readable = False  # ASE 3.22 accepts only 9-value stress
        elif stress_style == 2:
            vir = nrng.normal(size=(3, 3))
            vir = (vir + vir.T)
            inner, vals = fmt_symmetric(rng, vir)
            header.append("virial=" + quoted(rng, inner))
            v = np.array(vals).reshape(3, 3)
            frame["stress"] = (-v / abs(np.linalg.det(cell))).tolist()
        elif stress_style == 3:
            s = nrng.normal(size=(3, 3)) * 0.01
            s = s + s.T
            inner, vals = fmt_symmetric(rng, s)
            header.append("stress=" + quoted(rng, inner))
            frame["stress"] = np.array(vals).reshape(3, 3).tolist()

        if rng.random() < 0.6:
            ct = rng.choice(["bulk", "surface slab", "md_300K", "liquid water"])
            header.append("config_type=" + ('"%s"' % ct if " " in ct or rng.random() < 0.3 else ct))
            frame["config_type"] = ct
        if rng.random() < 0.4:
            w = rng.choice(["0.5", "2", "1e-1"])
            header.append("config_energy_weight=" + w)
            frame["weights"]["config_energy_weight"] = float(w)
        if rng.random() < 0.3:
            header.append("config_stress_weight=0.25")
            frame["weights"]["config_stress_weight"] = 0.25
        if rng.random() < 0.5:
            header.append('note="two words"')
            frame["info"]["note"] = "two words"
        if rng.random() < 0.3:
            header.append(r'said="a \"quoted\" word"')
            frame["info"]["said"] = 'a "quoted" word'
        if rng.random() < 0.4:
            header.append("is_relaxed")  # bare flag: True
            frame["info"]["is_relaxed"] = "T"
        if rng.random() < 0.4:
            header.append("step=%d" % rng.randrange(1000))
            frame["info"]["step"] = header[-1].split("=")[1]
        if rng.random() < 0.3:
            header.append("spacegroup='P 1'")
            frame["info"]["spacegroup"] = "P 1"
        rng.shuffle(header)

        pos_vals = np.zeros((n, 3))
        force_vals = np.zeros((n, 3))
        lines = []
        for a in range(n):
            fields = []
            for name, _, count in columns:
                if name == "species":
                    sym = chemical_symbols[numbers[a]]
                    fields.append(rng.choice([sym, sym, sym.upper(), sym.lower()]))
                elif name == "Z":
                    fields.append(str(numbers[a]))
                elif name == "pos":
                    for k in range(3):
                        t, v = fmt_number(rng, positions[a, k])
                        fields.append(t)
                        pos_vals[a, k] = v
                elif name == force_name:
                    for k in range(3):
                        t, v = fmt_number(rng, forces[a, k])
                        fields.append(t)
                        force_vals[a, k] = v
                elif name == "tags":
                    fields.append(str(rng.randrange(-3, 10)))
                elif name == "label":
                    fields.append(random_word(rng, 3))
                else:
                    fields.extend("%.6f" % rng.random() for _ in range(count))
            sep = rng.choice([" ", "   ", "\t"])
            lines.append(rng.choice(["", "  "]) + sep.join(fields) + rng.choice(["", " "]))
        frame["positions"] = pos_vals.tolist()
        if force_name:
            frame["forces"] = force_vals.tolist()

        eol = "\r\n" if rng.random() < 0.1 else "\n"
        chunk = eol.join([str(n), " ".join(header)] + lines) + eol
        text.append(chunk)
        expected.append(frame)
        ase_readable.append((readable, chunk))

    with open(path, "w", newline="") as f:
        f.write("".join(text) + "\n\n")

    # Cross-check the ground truth against ASE's own reader.
    checked = 0
    for k, ((readable, chunk), frame) in enumerate(zip(ase_readable, expected)):
        if not readable:
            continue
        atoms = ase.io.read(io.StringIO(chunk), index=0, format="extxyz")
        got = frame_from_atoms(atoms)
        for key in ["numbers", "pbc", "config_type"]:
            assert got[key] == frame[key], (k, key, got[key], frame[key])
        for key in ["positions", "cell"]:
            assert np.array_equal(np.asarray(got[key]).reshape(-1, 3),
                                  np.asarray(frame[key]).reshape(-1, 3)), (k, key)
        for key in ["energy", "forces", "stress"]:
            if frame[key] is None:
                assert got[key] is None, (k, key, got[key])
            else:
                assert np.allclose(got[key], frame[key], rtol=1e-14, atol=0), (k, key)
        for key, val in frame["info"].items():
            if isinstance(got["info"][key], str):
                assert got["info"][key] == val, (k, key, got["info"][key], val)
        for key, val in frame["weights"].items():
            assert got["weights"][key] == val, (k, key)
        checked += 1

    with open(out, "w") as f:
        json.dump({"frames": expected, "ase_checked": checked}, f)


def main(argv):
    cmd = argv[1]
    if cmd == "symbols":
        with open(argv[2], "w") as f:
            json.dump(chemical_symbols, f)
    elif cmd == "read":
        cmd_read(argv[2], argv[3])
    elif cmd == "random":
        cmd_random(argv[2], argv[3], int(argv[4]), int(argv[5]))
    elif cmd == "hand":
        cmd_hand(argv[2], argv[3], int(argv[4]), int(argv[5]))
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
