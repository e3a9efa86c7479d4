#!/usr/bin/python3
"""Speed at MD scale (issue 19) in one command: inference atoms/s and peak
memory per atom from 256 to 131072 atoms (fcc Cu, 5 Å) through the C++ API,
the Python calculator and LAMMPS/KIM; 2 threads against 1; the training
path's cost per atom; bf16-mixed against 32-true training; the machine's
GEMM rates; the CPU model and flags. Issue 48 adds the MACE engine against
its exact path, LAMMPS/KIM against the C++ API (kim), ns/day of a 1000-atom
Cu MD through LAMMPS/KIM and ASE on 1 and 2 threads (md), and beside each
inference row the arithmetic limit: the hand-counted FLOPs per atom
(hand_flops.h) at the GEMM rate. Every ratio is measured in this run.

Usage: /usr/bin/python3 bench/run_md_scale.py [--build build] [--quick]
       [--work /tmp/crucible_bench] [--reps 4,8,16,32] [--deploy-reps 4,8,16]
       [--train-steps 60] [--train-rounds 3]
--quick runs the MACE engine section and the kim section at 2048 and 16384
atoms (issue 48): engine_speedup MODEL ATOMS RATIO lines (the engine
against the exact path side by side) and kim_vs_api MODEL DTYPE ATOMS RATIO
FLOOR lines (LAMMPS/KIM µs per atom-step over the C++ API's for the same
model and dtype, and the ratio that the layers' work on ghosts alone gives).
Needs a built tree, Debian's python3-ase, lmp and libkim-api-dev.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_benchmarks import cpu_flags, cpu_model, fields, last_line  # noqa: E402


def limit_us(flops_per_atom, gflops):
    """The arithmetic limit: µs per atom of `flops_per_atom` FLOPs at `gflops` GFLOP/s (the GEMM rate)."""
    return flops_per_atom / (gflops * 1e3)


def available_gb():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("MemAvailable:")) / 2 ** 20


def run(cmd, env):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/crucible_bench")
    ap.add_argument("--reps", default="4,8,16,32", help="fcc cells per side: 4·rep³ atoms")
    ap.add_argument("--deploy-reps", default="4,8,16,32")
    ap.add_argument("--train-reps", default="4,8,12,16")
    ap.add_argument("--train-steps", type=int, default=60)
    ap.add_argument("--train-rounds", type=int, default=3, help="rounds over all sizes of the training-path section")
    ap.add_argument("--bf16-steps", type=int, default=300, help="SchNet training steps of the bf16 section")
    ap.add_argument("--bf16-seeds", default="0,1,2", help="SchNet initial-weight seeds of the bf16 section")
    ap.add_argument("--thread-rounds", type=int, default=6, help="alternating 1/2-thread rounds of the threads section")
    ap.add_argument("--train-thread-rounds", type=int, default=3, help="rounds of the train_threads section")
    ap.add_argument("--kim-reps", default="8,16", help="fcc cells per side of the kim section")
    ap.add_argument("--kim-rounds", type=int, default=3, help="rounds (LAMMPS run, then C++ API) of the kim section")
    ap.add_argument("--sections", default="engine,kim,md,inference,threads,training,bf16,train_threads,deploy",
                    help="comma-separated subset to run")
    ap.add_argument("--engine-rounds", type=int, default=3, help="alternating rounds of the engine section")
    ap.add_argument("--engine-reps", default="4,8,16,32",
                    help="fcc cells per side of the engine section (the medium MACE stops at 16: ~0.5 MB per atom)")
    ap.add_argument("--quick", action="store_true",
                    help="the checks' form (issue 48): the engine section alone, at 2048 atoms")
    a = ap.parse_args()
    if a.quick:
        a.sections = "engine,kim"
        a.kim_rounds = 1
        a.engine_reps = "8"
    bench = os.path.join(a.build, "bench")
    inf = os.path.join(bench, "bench_inference")
    env1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env2 = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
    os.makedirs(a.work, exist_ok=True)
    data = os.path.join(a.work, "cu_emt_500.extxyz")
    if not os.path.exists(data):
        frames = "40" if a.quick else "500"  # --quick: the kim section's 5 training steps only
        run([sys.executable, os.path.join(HERE, "reference", "make_cu_emt.py"), data, "--frames", frames], env1)

    print(f"Crucible at MD scale ({time.strftime('%Y-%m-%d')}, {os.uname().nodename})")
    print(f"CPU: {cpu_model()}; flags: {cpu_flags()}")
    gemm_lines = [fields(l) for l in run([inf, "--model", "gemm"], env1).splitlines() if l.startswith("gemm")]
    gemm = {f["dtype"]: float(f["gflops"]) for f in gemm_lines}
    print(f"GEMM 1024³, 1 thread: float32 {gemm['float32']:.0f} GFLOP/s, bfloat16 {gemm['bfloat16']:.0f} GFLOP/s "
          f"(ratio {gemm['bfloat16'] / gemm['float32']:.1f}), float64 {gemm['float64']:.0f} GFLOP/s")
    print("arithmetic limit: an inference call's FLOPs per atom counted by hand from the architecture "
          "(bench/hand_flops.h) at the GEMM rate of its dtype, 1 thread: the µs/atom no implementation of the "
          "same algorithm beats on one core")
    print(f"malloc: {gemm_lines[0].get('malloc', '?')} in the C++ executables (the Python calculator and "
          f"LAMMPS/KIM run on their host process's malloc); LibTorch's blocks of 16 MiB or more are kept for "
          f"reuse in all of them (the large block cache)")
    kept = os.environ.get("CRUCIBLE_KEEP_DENORMALS", "") not in ("", "0")
    print("denormals: " + ("kept (CRUCIBLE_KEEP_DENORMALS set): slow on Intel CPUs" if kept else
                           "flushed to zero while Crucible computes (FTZ/DAZ, docs/training_speed.md)"))
    print()

    def one(model, rep, threads=1, path="inference", flops=True):
        env = env2 if threads == 2 else env1
        out = run([inf, "--model", model, "--reps", str(rep), "--threads", str(threads), "--path", path]
                  + ([] if flops else ["--flops", "0"]), env)
        return fields(last_line(out, "model="))

    sections = set(a.sections.split(","))
    if "engine" in sections:
        # Issue 48: the MACE inference engine (radial splines so far) against
        # the exact path of the same model, alternating call by call in one
        # process; the small MACE and one of MACE-MP-0 medium's size.
        print(f"MACE inference engine against the exact path (energy + forces + stress, float32, random weights, "
              f"1 thread; {a.engine_rounds} alternating rounds in one process per size, median and range; targets "
              f"at 2048 atoms):")
        for size in ("small", "medium"):
            for rep in [int(r) for r in a.engine_reps.split(",")]:
                if size == "medium" and rep > 16:
                    continue  # ~0.5 MB per atom: 131072 atoms would not fit this machine kind's 24 GB
                out = run([inf, "--model", "mace", "--mace-size", size, "--reps", str(rep), "--threads", "1",
                           "--flops", "0", "--engine-rounds", str(a.engine_rounds)], env1)
                f = fields(last_line(out, "engine_side_by_side"))
                flops = float(f["hand_flops_per_atom"])
                limit = limit_us(flops, gemm["float32"])
                target = f"; target {'4' if size == 'small' else '3'}x" if rep == 8 else ""
                print(f"  mace_{size:<7} {int(f['atoms']):>6} atoms: engine {float(f['us_per_atom_engine']):.1f} "
                      f"µs/atom, exact {float(f['us_per_atom_exact']):.1f} µs/atom: {float(f['speedup_median']):.2f}x "
                      f"({float(f['speedup_min']):.2f}-{float(f['speedup_max']):.2f}){target}; hand count "
                      f"{flops / 1e6:.2f} MFLOP/atom, arithmetic limit {limit:.1f} µs/atom: engine at "
                      f"{100 * limit / float(f['us_per_atom_engine']):.0f}% of it, exact "
                      f"{100 * limit / float(f['us_per_atom_exact']):.0f}%", flush=True)
                print(f"engine_speedup mace_{size} {f['atoms']} {float(f['speedup_median']):.3f}", flush=True)
        # SchNet's filter network as splines (SchNetImpl::filter_spline)
        # against the network per pair, the same way; no target.
        for rep in [int(r) for r in a.engine_reps.split(",")]:
            out = run([inf, "--model", "schnet", "--reps", str(rep), "--threads", "1", "--flops", "0",
                       "--engine-rounds", str(a.engine_rounds)], env1)
            f = fields(last_line(out, "engine_side_by_side"))
            flops = float(f["hand_flops_per_atom"])
            limit = limit_us(flops, gemm["float32"])
            print(f"  schnet       {int(f['atoms']):>6} atoms: filter splines {float(f['us_per_atom_engine']):.1f} "
                  f"µs/atom, exact {float(f['us_per_atom_exact']):.1f} µs/atom: {float(f['speedup_median']):.2f}x "
                  f"({float(f['speedup_min']):.2f}-{float(f['speedup_max']):.2f}); hand count "
                  f"{flops / 1e6:.2f} MFLOP/atom, arithmetic limit {limit:.1f} µs/atom: splines at "
                  f"{100 * limit / float(f['us_per_atom_engine']):.0f}% of it", flush=True)
            print(f"engine_speedup schnet {f['atoms']} {float(f['speedup_median']):.3f}", flush=True)
        print()
    if "kim" in sections:
        kim_section(a, inf, data, env1, gemm)
    if "md" in sections:
        md_section(a, data, env1, env2)
    trainers = (("schnet", [os.path.join(bench, "bench_schnet_training"), data, "--steps", str(a.train_steps)]),
                ("mace", [os.path.join(bench, "bench_mace_training"), data, "--steps", str(a.train_steps // 2)]))
    tags = {"schnet": "crucible", "mace": "crucible_mace"}
    if "inference" in sections:
        reps = [int(r) for r in a.reps.split(",")]
        print("C++ API inference (energy + forces + stress, float32, random weights, 1 thread; one process per size):")
        print(f"  {'model':<7} {'atoms':>7} {'atoms/s':>9} {'µs/atom':>9} {'peak KB/atom':>13} {'µs/atom vs smallest':>20} "
              f"{'limit µs/atom':>14} {'of limit':>9}")
        for model in ("schnet", "mace"):
            base = None
            for rep in reps:
                f = one(model, rep)
                us = float(f["us_per_atom"])
                base = base or us
                limit = limit_us(float(f["hand_flops_per_atom"]), gemm["float32"])
                print(f"  {model:<7} {int(f['atoms']):>7} {float(f['atoms_per_s']):>9.0f} {us:>9.1f} "
                      f"{float(f['peak_kb_per_atom']):>13.1f} {us / base:>19.2f}x {limit:>14.1f} "
                      f"{100 * limit / us:>8.0f}%", flush=True)
        print()
    if "threads" in sections:
        rounds = a.thread_rounds
        print(f"threads, 16384-atom inference: {rounds} rounds of one call with 1 thread and one with 2 in one "
              "process, alternating (side by side; the VM's speed drifts between processes); median speedup "
              "and the range over rounds:")
        for model in ("schnet", "mace"):
            out = run([inf, "--model", model, "--reps", "16", "--threads", "2", "--flops", "0",
                       "--thread-rounds", str(rounds)], env2)
            f = fields(last_line(out, "threads_side_by_side"))
            us1, us2 = float(f["us_per_atom_1"]), float(f["us_per_atom_n"])
            print(f"  {model:<7} 1 thread {1e6 / us1:.0f} atoms/s, 2 threads {1e6 / us2:.0f} atoms/s: "
                  f"{float(f['speedup_median']):.2f}x ({float(f['speedup_min']):.2f}-{float(f['speedup_max']):.2f})",
                  flush=True)
        print()
    if "training" in sections:
        rounds = a.train_rounds
        print("training path (outputs with create_graph + energy/force loss backward), 1 thread; FLOPs as LibTorch's")
        print("profiler counts them (matrix products and element-wise ops, not the hand-written edge kernels: a lower bound).")
        print(f"{rounds} rounds, each running every size once (one process per size, back to back); the ratio to the "
              "smallest is taken within each round (side by side; the VM's speed drifts between rounds), the median "
              "over rounds printed with its range:")
        for model in ("schnet", "mace"):
            sizes = []
            for rep in [int(r) for r in a.train_reps.split(",")]:
                # MB per atom, measured (Zen 5, 16384 atoms: 0.81 direct, 0.56 checkpointed);
                # MACE checkpoints its product basis above 16384 atoms.
                mb = (0.9 if 4 * rep ** 3 <= 16384 else 0.6) if model == "mace" else 0.4
                need_gb = 4 * rep ** 3 * mb / 1024
                if need_gb > 0.8 * available_gb():
                    print(f"  {model:<7} {4 * rep ** 3:>7} not run: the training path would keep ~{need_gb:.0f} GB "
                          f"(~{mb} MB per atom), {available_gb():.0f} GB available")
                    continue
                sizes.append(rep)
            runs = {rep: [] for rep in sizes}
            for r in range(rounds):
                for rep in sizes:  # FLOPs profiled in the first round only
                    runs[rep].append(one(model, rep, path="training", flops=(r == 0)))
            for rep in sizes:
                first = runs[rep][0]
                us = [float(f["us_per_atom"]) for f in runs[rep]]
                ratios = [u / float(b["us_per_atom"]) for u, b in zip(us, runs[sizes[0]])]
                rate = float(first["achieved_gflops"])
                flops = (f"profiled ops {rate:.1f} GFLOP/s = {100 * rate / gemm['float32']:.0f}% of the float32 GEMM rate"
                         if rate == rate else "not profiled (the profiler's records would not fit)")
                print(f"  {model:<7} {int(first['atoms']):>7} {statistics.median(us):>9.1f} µs/atom "
                      f"{float(first['peak_kb_per_atom']):>8.1f} KB/atom {statistics.median(ratios):>6.2f}x the smallest "
                      f"({min(ratios):.2f}-{max(ratios):.2f}); {flops}", flush=True)
        print()
    if "bf16" in sections:
        # MACE's 30-step runs take seconds, so this VM's drift between two
        # processes moved its single ratio from 0.95x to 1.42x within hours
        # (2026-12-05): the median of a few side-by-side rounds instead.
        mace_rounds = 3
        seeds = [int(x) for x in a.bf16_seeds.split(",")]
        print(f"bf16-mixed against 32-true training (batch 8, 32-atom Cu cells, 1 thread; SchNet width 64 and "
              f"schnet128 width 128 (schnetpack's default), {a.bf16_steps} steps, initial weights from seeds "
              f"{a.bf16_seeds}; MACE {a.train_steps // 2} steps, seed 0, {mace_rounds} rounds; each seed or round "
              "runs the two precisions one after the other and gives one ratio; MAE on 50 held-out cells after "
              "those steps, averaged over the seeds: between seeds alone it differs by up to ~1.5x):")
        native = any(f in cpu_flags().split() for f in ("avx512_bf16", "amx_bf16"))
        # The GEMMs' share of a SchNet step, which bf16 speeds up, grows with the width.
        schnet = [os.path.join(bench, "bench_schnet_training"), data, "--steps", str(a.bf16_steps)]
        variants = (("schnet", schnet, seeds), ("schnet128", schnet + ["--width", "128"], seeds),
                    ("mace", trainers[1][1], [None] * mace_rounds))
        for name, cmd, runs in variants:
            rate = {"32-true": [], "bf16-mixed": []}
            mae = {p: [0.0, 0.0] for p in rate}
            for seed in runs:
                extra = [] if seed is None else ["--seed", str(seed)]
                for p in rate:  # the two precisions side by side for each seed
                    f = fields(last_line(run(cmd + extra + ["--precision", p], env1), tags.get(name, "crucible")))
                    rate[p].append(float(f["structures_per_s"]))
                    mae[p][0] += float(f["energy_mae_mev_per_atom"]) / len(runs)
                    mae[p][1] += float(f["forces_mae_mev_per_a"]) / len(runs)
            ratios = sorted(x / y for x, y in zip(rate["bf16-mixed"], rate["32-true"]))
            s32, s16 = statistics.median(rate["32-true"]), statistics.median(rate["bf16-mixed"])
            note = "" if native else " (this CPU emulates bf16: not measurable here)"
            print(f"  {name:<9} 32-true {s32:.1f} structures/s, bf16-mixed {s16:.1f}: "
                  f"{statistics.median(ratios):.2f}x (per {'round' if runs[0] is None else 'seed'} "
                  f"{ratios[0]:.2f}-{ratios[-1]:.2f}){note}; "
                  f"MAE E {mae['32-true'][0]:.1f} -> {mae['bf16-mixed'][0]:.1f} meV/atom "
                  f"({mae['bf16-mixed'][0] / mae['32-true'][0]:.2f}x), "
                  f"F {mae['32-true'][1]:.1f} -> {mae['bf16-mixed'][1]:.1f} meV/Å "
                  f"({mae['bf16-mixed'][1] / mae['32-true'][1]:.2f}x)", flush=True)
        print()
    if "train_threads" in sections:
        # The training default itself: `crucible train` with the default model
        # and recipe (batch 8, float32) on these Cu cells, with
        # training.num_threads 1, 2 and 0 (auto) one after the other in each
        # round. Throughput from metrics.jsonl (elapsed_s every 10 steps),
        # after the first 10 steps and before the first epoch's validation.
        rounds, steps = a.train_thread_rounds, {"schnet": 50, "mace": 30}
        print(f"training threads: `crucible train` with the default model and recipe (batch 8, float32), "
              f"training.num_threads 1, 2 and 0 (auto) one after the other, {rounds} rounds; structures/s from "
              "steps 10 to the last (SchNet 50, MACE 30); median ratio 2 vs 1 threads with its range over rounds, "
              "and what auto picked in each round:")
        binary = os.path.join(a.build, "crucible")
        env_auto = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}

        def train_run(name, threads):
            run_dir = os.path.join(a.work, f"threads_{name}_{threads}")
            out = run([binary, "train", f"data.train_file={data}", f"model.type={name}", "model.cutoff=5.0",
                       "training.batch_size=8", "training.dtype=float32", f"training.num_steps={steps[name]}",
                       f"training.num_threads={threads}", f"output.run_dir={run_dir}", "output.overwrite=true"],
                      env_auto)
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                logged = [j for j in map(json.loads, f) if j.get("type") == "train"]
            first, last = logged[0], logged[-1]  # steps 10 and the last
            rate = 8 * (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])
            chosen = [l.split("CPU threads: ", 1)[1] for l in out.splitlines() if "CPU threads: " in l][0]
            return rate, chosen

        for name in ("schnet", "mace"):
            rates = {1: [], 2: [], 0: []}
            picks = []
            for _ in range(rounds):
                for t in (1, 2, 0):
                    rate, chosen = train_run(name, t)
                    rates[t].append(rate)
                    if t == 0:
                        picks.append(chosen)
            ratios = sorted(x / y for x, y in zip(rates[2], rates[1]))
            med = statistics.median(ratios)
            faster = "2" if med > 1.05 else ("1" if med < 1 / 1.05 else "tie within 5%")
            picked = [int(p.split()[0]) for p in picks]
            print(f"  {name:<7} 1 thread {statistics.median(rates[1]):.1f} structures/s, 2 threads "
                  f"{statistics.median(rates[2]):.1f}, auto {statistics.median(rates[0]):.1f}: 2 vs 1 {med:.2f}x "
                  f"({ratios[0]:.2f}-{ratios[-1]:.2f}); faster: {faster}; auto picked {', '.join(map(str, picked))}",
                  flush=True)
            print(f"          last auto: {picks[-1]}", flush=True)
        print()
    if "deploy" in sections:
        print("deployment paths (trained 5-step models, 1 thread; calculator and lammps_kim_f32 float32, lammps_kim float64):")
        out = run([sys.executable, os.path.join(HERE, "bench_deploy.py"), "--build", a.build, "--work", a.work,
                   "--reps", a.deploy_reps], env1)
        print(f"  {'path':<18} {'model':<7} {'atoms':>7} {'atoms/s':>9} {'µs/atom':>9} {'peak MiB':>9} "
              f"{'KB/atom above smallest':>23} {'limit µs/atom':>14}")
        hand_flops = {}  # the trained models' count (fcc Cu: the same edges per atom at every size)
        for model in ("schnet", "mace"):
            model_dir = os.path.join(os.path.abspath(a.work), "deploy", f"{model}_run")
            if os.path.isdir(model_dir):
                f = fields(last_line(run([inf, "--model-dir", model_dir, "--reps", "4", "--flops", "0"], env1), "model="))
                hand_flops[model] = float(f["hand_flops_per_atom"])
        for line in out.splitlines():
            if not line.startswith("path="):
                continue
            f = fields(line)
            if "skipped" in f:
                print(f"  {f['path']:<18} {f['model']:<7} {int(f['atoms']):>7} not run: ~{f['estimate_gb']} GB "
                      f"estimated, {f['available_gb']} GB available", flush=True)
                continue
            dtype = "float64" if f["path"] == "lammps_kim" else "float32"
            limit = limit_us(hand_flops[f["model"]], gemm[dtype]) if f["model"] in hand_flops else float("nan")
            print(f"  {f['path']:<18} {f['model']:<7} {int(f['atoms']):>7} {float(f['atoms_per_s']):>9.0f} "
                  f"{float(f['us_per_atom']):>9.1f} {int(f['peak_mb']):>9} {f['marginal_kb_per_atom']:>23} "
                  f"{limit:>14.1f}", flush=True)


# The unit each model's layer work scales with, for the kim floor: MACE's
# tensor products run once per edge. SchNet's work is split by its hand
# count (bench_inference's hand_shares_atoms_edges_pairs): the dense maps per
# atom, cfconv per edge, the filter per distance pair (reverse_edge_pairs;
# an edge whose reverse is not evaluated, a padding atom's outward edge,
# costs a whole pair). With the filter network per pair the pairs were 92%
# of it; with the filter splines (issue 48) they are about half.
FLOOR_UNIT = {"schnet": "weighted", "mace": "edges"}


def weighted_floor(floors, shares):
    """sum_u share_u · floor_u over atoms, edges and pairs; `shares` is the
    API line's hand_shares_atoms_edges_pairs ("a,e,p")."""
    w = [float(x) for x in shares.split(",")]
    return sum(wu * floors[u] for wu, u in zip(w, ("atoms", "edges", "pairs"))) / sum(w)


def kim_floors(st, atoms, api_edges):
    """The ratio of the KIM model's per-layer work (CRUCIBLE_KIM_STATS line
    `st`, means per call) to the C++ API's on the periodic cell (`atoms`
    atoms, `api_edges` edges, every layer on all; pairs = edges / 2), by
    atoms, edges and pairs: sum_t work_t / (L · API's)."""
    def layers(key):
        return [float(x) for x in st[key].split(",")] if st[key] != "all" else []
    nodes, edges, pairs = layers("layer_nodes"), layers("layer_edges"), layers("layer_pairs")
    if not nodes:  # every layer on every evaluated particle and edge
        return {"atoms": float(st["evaluated"]) / atoms, "edges": float(st["edges"]) / api_edges,
                "pairs": float(st["edges"]) / api_edges}
    count = len(nodes)
    return {"atoms": sum(nodes) / (count * atoms), "edges": sum(edges) / (count * api_edges),
            "pairs": sum(pairs) / (count * api_edges / 2)}


def md_section(a, data, env1, env2, steps=20):
    """Issue 48: ns/day of a 1000-atom fcc Cu MD (5 x 5 x 10 cells, NVE from
    300 K, 1 fs) with the `crucible train` models (5 steps, cutoff 5 Å):
    LAMMPS/KIM (float32 and float64 exports) on 1 thread, 2 threads and
    mpirun -np 2, and ASE's VelocityVerlet with crucible.Calculator
    (float32) on 1 and 2 threads; `steps` timed steps each, after LAMMPS's
    setup or one warm-up step. ns/day = 86400 s / (seconds per step) × 1 fs."""
    from bench_deploy import lammps_run, prepare_model  # noqa: E402
    work = os.path.abspath(os.path.join(a.work, "md"))
    os.makedirs(work, exist_ok=True)
    extra = dict(HOME=os.path.join(work, "home"), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                 OMPI_MCA_rmaps_base_oversubscribe="1")
    e1, e2 = dict(env1, **extra), dict(env2, **extra)
    binary = os.path.abspath(os.path.join(a.build, "crucible"))
    pydir = os.path.abspath(os.path.join(a.build, "python"))
    print(f"MD of 1000 fcc Cu atoms (NVE from 300 K, 1 fs; {steps} timed steps), the `crucible train` models: ns/day")
    print(f"  {'model':<7} {'path':<28} {'1 thread':>9} {'2 threads':>10} {'mpirun -np 2':>13}")
    for model in ("schnet", "mace"):
        run_dir, items = prepare_model(binary, work, os.path.abspath(data), e1, model)
        for name, dtype in sorted(items.values(), key=lambda v: v[1]):
            days = [86400e-6 / lammps_run(work, name, (5, 5, 10), env, steps=steps, processes=procs)[0]
                    for env, procs in ((e1, 1), (e2, 1), (e1, 2))]
            print(f"  {model:<7} {'LAMMPS/KIM ' + dtype:<28} {days[0]:>9.3f} {days[1]:>10.3f} {days[2]:>13.3f}",
                  flush=True)
        days = []
        for env in (e1, e2):
            out = run([sys.executable, os.path.join(HERE, "bench_deploy.py"), "--child-md", pydir, run_dir,
                       str(steps)], env)
            days.append(86400e-6 / float(fields(last_line(out, "seconds_per_step="))["seconds_per_step"]))
        print(f"  {model:<7} {'ASE VelocityVerlet, float32':<28} {days[0]:>9.3f} {days[1]:>10.3f} {'':>13}",
              flush=True)
    print()


def kim_section(a, inf, data, env1, gemm):
    """Issue 48: LAMMPS/KIM against the C++ API for the same trained model
    (5 training steps, cutoff 5 Å) and dtype, fcc Cu, 1 thread. Each round
    runs LAMMPS (NVE, 3 steps after setup; µs per atom-step from its loop
    time) and then bench_inference --model-dir (energy + forces + stress,
    best of 3 calls); the median of the per-round ratios is printed. The
    floor: LAMMPS's KIM model runs layer t of L on the particles within
    L - 1 - t hops of its atoms (the driver's CRUCIBLE_KIM_STATS), so with
    the API's cost per unit of layer work the ghosts alone give
    sum_t work_t / (L · the API's work), counted in the model's unit
    (FLOOR_UNIT: SchNet's by its hand count's shares of atoms, edges and
    pairs; the floors by atoms, edges and pairs are printed too)."""
    from bench_deploy import lammps_run, prepare_model  # noqa: E402
    work = os.path.abspath(os.path.join(a.work, "kim"))
    os.makedirs(work, exist_ok=True)
    env = dict(env1, HOME=os.path.join(work, "home"), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    binary = os.path.abspath(os.path.join(a.build, "crucible"))
    stats_file = os.path.join(work, "kim_stats.txt")
    reps = [int(r) for r in a.kim_reps.split(",")]
    print(f"LAMMPS/KIM against the C++ API (same model and dtype, fcc Cu, 1 thread; {a.kim_rounds} round(s) of "
          "a LAMMPS run (3 NVE steps) then the API, median ratio; floor = the ghosts' share of the layers' work):")
    for model in ("schnet", "mace"):
        run_dir, items = prepare_model(binary, work, os.path.abspath(data), env, model)
        for path, (name, dtype) in sorted(items.items(), key=lambda kv: kv[1][1]):
            for rep in reps:
                ratios, kim_us, api_us = [], [], []
                for _ in range(a.kim_rounds):
                    if os.path.exists(stats_file):
                        os.remove(stats_file)
                    seconds, _peak = lammps_run(work, name, rep, dict(env, CRUCIBLE_KIM_STATS=stats_file), steps=3)
                    with open(stats_file) as f:
                        st = fields(f.read().splitlines()[-1])
                    out = run([inf, "--model-dir", run_dir, "--dtype", dtype, "--reps", str(rep), "--threads", "1",
                               "--flops", "0"], env)
                    api_line = fields(last_line(out, "model="))
                    api, api_edges = float(api_line["us_per_atom"]), int(api_line["edges"])
                    limit = limit_us(float(api_line["hand_flops_per_atom"]), gemm[dtype])
                    n = 4 * rep ** 3
                    kim_us.append(1e6 * seconds / n)
                    api_us.append(api)
                    ratios.append(kim_us[-1] / api)
                floors = kim_floors(st, n, api_edges)
                if FLOOR_UNIT[model] == "weighted":
                    shares = api_line["hand_shares_atoms_edges_pairs"]
                    floor = weighted_floor(floors, shares)
                    unit = "the hand count's shares (atoms, edges, pairs " + \
                        ", ".join(f"{100 * float(x):.0f}%" for x in shares.split(",")) + ")"
                else:
                    floor, unit = floors[FLOOR_UNIT[model]], FLOOR_UNIT[model]
                layers = [float(x) for x in st["layer_nodes"].split(",")] if st["layer_nodes"] != "all" else []
                ratio = statistics.median(ratios)
                print(f"  {model:<7} {dtype:<8} {n:>6} atoms: LAMMPS/KIM {statistics.median(kim_us):.1f} µs/atom-step, "
                      f"C++ API {statistics.median(api_us):.1f} µs/atom: {ratio:.2f}x (rounds {min(ratios):.2f}-"
                      f"{max(ratios):.2f}); floor {floor:.2f} ({float(st['particles']):.0f} particles, layers on "
                      f"{', '.join(f'{x:.0f}' for x in layers) or 'all'}; by {unit}; by atoms "
                      f"{floors['atoms']:.2f}, edges {floors['edges']:.2f}, pairs {floors['pairs']:.2f}); "
                      f"{ratio / floor:.2f}x the floor; arithmetic limit {limit:.1f} µs/atom (API at "
                      f"{100 * limit / statistics.median(api_us):.0f}% of it)", flush=True)
                print(f"kim_vs_api {model} {dtype} {n} {ratio:.3f} {floor:.3f}", flush=True)
            if not a.quick:  # issue 48: 2 MPI processes on the 2 cores against 1, the largest size
                rep = reps[-1]
                one_s = [lammps_run(work, name, rep, env, steps=3)[0] for _ in range(2)]
                two_s = [lammps_run(work, name, rep, env, steps=3, processes=2)[0] for _ in range(2)]
                speedup = min(one_s) / min(two_s)
                print(f"  {model:<7} {dtype:<8} {4 * rep ** 3:>6} atoms: mpirun -np 2 {1e3 * min(two_s):.0f} ms/step, "
                      f"-np 1 {1e3 * min(one_s):.0f} ms/step: {speedup:.2f}x (best of 2 runs each)", flush=True)
                print(f"kim_np2_speedup {model} {dtype} {4 * rep ** 3} {speedup:.3f}", flush=True)
    print()


if __name__ == "__main__":
    main()
