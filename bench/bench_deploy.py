#!/usr/bin/python3
"""Inference through the deployment paths (issue 19, deliverable 5): atoms/s
and peak memory of energy + forces + stress for rattled fcc Cu cells (a =
3.61 Å, 5 Å cutoff) through the Python calculator (crucible.Calculator,
float32) and Debian's LAMMPS through KIM, once exported with `--dtype
float32` (path lammps_kim_f32, like for like with the calculator) and once
in float64, the export's default (path lammps_kim). Models: a SchNet
and a MACE (the `crucible train` defaults at cutoff 5 Å) trained for a few
steps on the Cu EMT set, so the weights are real but accuracy is not the
point. Each size runs in a fresh process: peak memory is that process's
maximum resident set, printed whole and per atom above the smallest size's.

Usage: bench/bench_deploy.py [--build build] [--work /tmp/crucible_bench]
       [--reps 4,8,16,32] [--models schnet,mace]
A size whose peak memory, scaled from the previous size by the particles
evaluated (ghosts included for KIM), would pass 80% of the available
memory is skipped with a "skipped=memory" line.
Prints one key=value line per path, model and size; run by
bench/run_benchmarks.py.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cu_atoms(rep):
    import numpy as np
    from ase.build import bulk
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((rep, rep, rep))
    rng = np.random.default_rng(7)
    atoms.positions += rng.normal(0.0, 0.02, atoms.positions.shape)
    return atoms


def child_md(pydir, run_dir, steps):
    """Runs in its own process: seconds per step of ASE's VelocityVerlet (1 fs)
    with crucible.Calculator (float32) on 1000 fcc Cu atoms (5 x 5 x 10
    cells) at 300 K, after one warm-up step."""
    sys.path.insert(0, pydir)
    import crucible
    from ase import units
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((5, 5, 10))
    atoms.calc = crucible.Calculator(run_dir, dtype="float32")
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=__import__("numpy").random.default_rng(7))
    dyn = VelocityVerlet(atoms, 1.0 * units.fs)
    dyn.run(1)
    t0 = time.perf_counter()
    dyn.run(steps)
    print(f"seconds_per_step={(time.perf_counter() - t0) / steps:.6f} atoms={len(atoms)}")


def child_calculator(pydir, run_dir, rep):
    """Runs in its own process: prints seconds per call and peak RSS (kB)."""
    sys.path.insert(0, pydir)
    import crucible
    calc = crucible.Calculator(run_dir, dtype="float32")
    atoms = cu_atoms(rep)
    atoms.calc = calc
    best = 1e30
    for k in range(3):
        calc.reset()
        t0 = time.perf_counter()
        calc.calculate(atoms, ["energy", "forces", "stress"], None)
        best = min(best, time.perf_counter() - t0) if k > 0 else best  # first call warms up
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"seconds={best:.6f} peak_kb={peak}")


def lammps_run(work, name, rep, env, steps=1, processes=1):
    """Seconds per step (LAMMPS's loop time over `steps`, NVE at 300 K with
    LAMMPS's metal timestep of 1 fs) and the peak RSS (kB) of `lmp` (under
    `mpirun -np processes` when above 1). `rep`: fcc cells per side, or
    (nx, ny, nz) cells."""
    nx, ny, nz = rep if isinstance(rep, tuple) else (rep, rep, rep)
    inp = os.path.join(work, f"in_{name}_{nx}x{ny}x{nz}.lmp")
    with open(inp, "w") as f:
        f.write(f"""kim init {name} metal
boundary p p p
lattice fcc 3.61
region box block 0 {nx} 0 {ny} 0 {nz}
create_box 1 box
create_atoms 1 box
kim interactions Cu
mass 1 63.546
displace_atoms all random 0.02 0.02 0.02 7 units box
neighbor 1.0 bin
velocity all create 300 7
fix 1 all nve
thermo_style custom step pe press
run {steps}
""")
    code = ("import resource,subprocess,sys;"
            f"p=subprocess.run({launcher(processes)!r}+['lmp','-in','{inp}','-log','none'],capture_output=True,text=True);"
            "sys.stdout.write(p.stdout);sys.stderr.write(p.stderr);"
            "print('peak_kb=%d'%resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);sys.exit(p.returncode)")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=work)
    if p.returncode != 0:
        raise SystemExit(f"lmp failed for {name} rep {rep}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    loops = [l for l in p.stdout.splitlines() if l.startswith("Loop time of")]
    seconds = float(loops[-1].split()[3]) / steps
    peak = int([l for l in p.stdout.splitlines() if l.startswith("peak_kb=")][-1].split("=")[1])
    return seconds, peak


def launcher(processes):
    return [] if processes == 1 else ["mpirun", "-np", str(processes)]


RANGE = {"schnet": 15.0, "mace": 10.0}  # interaction ranges of the bench models (3 and 2 layers at 5 Å)


def evaluated_particles(path, model, rep, a=3.61, skin=1.0):
    """Particles the model runs on: the cell's atoms, plus LAMMPS's ghosts
    within influence distance + skin for the KIM model."""
    if not path.startswith("lammps_kim"):
        return 4 * rep ** 3
    side = rep * a + 2 * (RANGE[model] + skin)
    return 4 * (side / a) ** 3


def available_kb():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("MemAvailable:"))


def prepare_model(binary, work, data, env, model):
    """Trains `model` (schnet or mace, cutoff 5 Å) for 5 steps on `data`,
    exports it to KIM in float64 and float32 and installs both into
    env["HOME"]'s user collection. Returns (run_dir, {path: (KIM name, dtype)})."""
    os.makedirs(env["HOME"], exist_ok=True)
    run_dir = os.path.join(work, f"{model}_run")
    subprocess.run([binary, "train", f"data.train_file={data}", f"model.type={model}", "model.cutoff=5.0",
                    "training.num_steps=5", "training.dtype=float32", f"output.run_dir={run_dir}",
                    "output.overwrite=true"], check=True, env=env, capture_output=True)
    items = {"lammps_kim": (f"Cu_{model}_bench", "float64"), "lammps_kim_f32": (f"Cu_{model}_bench_f32", "float32")}
    for name, dtype in items.values():
        kim_dir = os.path.join(work, name)
        shutil.rmtree(kim_dir, ignore_errors=True)
        subprocess.run([binary, "export", "kim", run_dir, "--name", name, "--out", kim_dir, "--dtype", dtype],
                       check=True, env=env, capture_output=True)
        for item in (name, name + "_driver"):  # an installed driver would make install skip the new model
            subprocess.run(["kim-api-collections-management", "remove", "--force", item], env=env,
                           capture_output=True)
        subprocess.run(["kim-api-collections-management", "install", "user", kim_dir], check=True, env=env,
                       capture_output=True)
    return run_dir, items


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_calculator(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-md":
        child_md(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/crucible_bench")
    ap.add_argument("--reps", default="4,8,16,32")
    ap.add_argument("--models", default="schnet,mace")
    a = ap.parse_args()
    binary = os.path.abspath(os.path.join(a.build, "crucible"))
    pydir = os.path.abspath(os.path.join(a.build, "python"))
    work = os.path.abspath(os.path.join(a.work, "deploy"))
    os.makedirs(work, exist_ok=True)
    data = os.path.join(os.path.abspath(a.work), "cu_emt_500.extxyz")
    if not os.path.exists(data):
        subprocess.run([sys.executable, os.path.join(HERE, "reference", "make_cu_emt.py"), data, "--frames", "500"],
                       check=True)
    env = dict(os.environ, HOME=os.path.join(work, "home"), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    reps = [int(r) for r in a.reps.split(",")]
    for model in a.models.split(","):
        run_dir, items = prepare_model(binary, work, data, env, model)
        for path in ("python_calculator", "lammps_kim_f32", "lammps_kim"):
            first = last = None
            for rep in reps:
                n = 4 * rep ** 3
                particles = evaluated_particles(path, model, rep)
                if last is not None:  # peak grows with the particles evaluated: skip what would not fit
                    estimate_kb = last[1] * particles / last[0]
                    if estimate_kb > 0.8 * available_kb():
                        print(f"path={path} model={model} threads=1 atoms={n} skipped=memory "
                              f"estimate_gb={estimate_kb / 2 ** 20:.0f} available_gb={available_kb() / 2 ** 20:.0f}",
                              flush=True)
                        continue
                if path == "python_calculator":
                    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", pydir, run_dir,
                                          str(rep)], check=True, env=env, capture_output=True, text=True).stdout
                    f = dict(kv.split("=") for kv in out.split())
                    seconds, peak = float(f["seconds"]), int(f["peak_kb"])
                else:
                    seconds, peak = lammps_run(work, items[path][0], rep, env)
                first = first or (n, peak)
                last = (particles, peak)
                marginal = (peak - first[1]) / (n - first[0]) if n > first[0] else float("nan")
                print(f"path={path} model={model} threads=1 atoms={n} atoms_per_s={n / seconds:.0f} "
                      f"us_per_atom={1e6 * seconds / n:.2f} peak_mb={peak / 1024:.0f} "
                      f"marginal_kb_per_atom={marginal:.2f}", flush=True)


if __name__ == "__main__":
    main()
