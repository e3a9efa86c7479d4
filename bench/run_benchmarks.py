#!/usr/bin/python3
"""Crucible's benchmark suite in one command (issue 7): prints a table of
training throughput against the Python reference (same machine, same run),
accuracy after the same steps, neighbor-list time against ASE, hook
dispatch overhead, peak memory and time per atom against system size.

Usage: /usr/bin/python3 bench/run_benchmarks.py [--build build] [--steps 200]
       [--work /tmp/crucible_bench]
Needs a built tree (bash scripts/build.sh) and Debian's python3-torch and
python3-ase. Absolute times on shared machines drift; compare the ratios,
which are measured side by side here.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return out.stdout


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def last_line(text, prefix):
    return [l for l in text.splitlines() if l.startswith(prefix)][-1]


def ase_neighbor_list_ms(data, count=20):
    from ase.io import read
    from ase.neighborlist import neighbor_list
    frames = read(data, index=f":{count}")
    neighbor_list("ijS", frames[0], 5.0)  # warm-up
    times = []
    for a in frames:
        t0 = time.perf_counter()
        neighbor_list("ijS", a, 5.0)
        times.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(times), len(frames[0])


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def cpu_flags():
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return " ".join(shown) if shown else "none of avx2/avx512f/avx512_bf16/amx_bf16"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--work", default="/tmp/crucible_bench")
    ap.add_argument("--mace-epochs", type=int, default=4, help="MACE epochs on the Cu EMT set (0 = skip MACE)")
    a = ap.parse_args()
    bench = os.path.join(a.build, "bench")
    os.makedirs(a.work, exist_ok=True)
    data = os.path.join(a.work, "cu_emt_500.extxyz")
    if not os.path.exists(data):
        run([sys.executable, os.path.join(HERE, "reference", "make_cu_emt.py"), data, "--frames", "500"])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    rows = {}
    for precision, flag in (("32-true", []), ("bf16-mixed", ["--bf16"])):
        ref = fields(last_line(run([sys.executable, os.path.join(HERE, "reference", "reference_train_eval.py"),
                                    data, "--steps", str(a.steps)] + flag, env), "reference"))
        ours = fields(last_line(run([os.path.join(bench, "bench_schnet_training"), data, "--steps", str(a.steps),
                                     "--precision", precision], env), "crucible"))
        rows[precision] = (ref, ours)

    # Threads: the same 32-true run with 2 intra-op threads.
    threads2 = fields(last_line(run([os.path.join(bench, "bench_schnet_training"), data, "--steps", str(a.steps),
                                     "--precision", "32-true", "--threads", "2"],
                                    dict(env, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")), "crucible"))

    # Issue 16: MACE (reference hyperparameters) between two runs of the Python
    # reference SchNet, the figure it is measured against. The reference runs
    # as users have it (Debian's OpenBLAS, whose autodetection may fall back to
    # generic kernels on new CPUs) and again with the kernels Crucible picks.
    mace = None
    if a.mace_epochs > 0:
        ref_cmd = [sys.executable, os.path.join(HERE, "reference", "reference_schnet.py"), data, "--steps", str(a.steps)]
        ref_a = fields(last_line(run(ref_cmd, env), "reference"))
        ours_mace = fields(last_line(run([os.path.join(bench, "bench_mace_training"), data, "--epochs",
                                          str(a.mace_epochs)], env), "crucible_mace"))
        ref_b = fields(last_line(run(ref_cmd, env), "reference"))
        core = ours_mace.get("blas", "")
        ref_tuned = None
        if core and core != "not OpenBLAS":
            ref_tuned = fields(last_line(run(ref_cmd, dict(env, OPENBLAS_CORETYPE=core)), "reference"))
        mace = (ours_mace, [ref_a, ref_b], ref_tuned)

    nl_ase_ms, nl_atoms = ase_neighbor_list_ms(data)
    scaling = [fields(l) for l in run([os.path.join(bench, "bench_size_scaling")], env).splitlines() if l.startswith("atoms=")]
    hooks = fields(last_line(run([os.path.join(bench, "bench_hook_dispatch")], env), "hooks="))
    # Issue 49: an empty Python hook in the C++ loop.
    py_out = run([sys.executable, os.path.join(HERE, "bench_python_hooks.py"), "--build", a.build], env)
    py_call = fields(last_line(py_out, "python_hook_us_per_call"))
    py_run = fields(last_line(py_out, "python_hook_in_run"))

    print(f"Crucible benchmarks ({time.strftime('%Y-%m-%d')}, {os.uname().nodename}, 1 thread, "
          f"{a.steps} training steps, 32-atom fcc Cu EMT, 500 frames, first 50 for validation)")
    print(f"CPU: {cpu_model()}; flags: {cpu_flags()}")
    print()
    print("training: SchNet 64 features, 3 interactions, 20 Gaussians, 5 Å cutoff, batch 8, Adam 1e-3")
    print(f"  {'precision':<11} {'ours str/s':>10} {'atoms/s':>9} {'reference':>10} {'ratio':>6}   "
          f"{'E MAE ours/ref (meV/atom)':>26}   {'F MAE ours/ref (meV/Å)':>24}")
    for precision, (ref, ours) in rows.items():
        ratio = float(ours["structures_per_s"]) / float(ref["structures_per_s"])
        print(f"  {precision:<11} {float(ours['structures_per_s']):>10.1f} {float(ours['atoms_per_s']):>9.0f} "
              f"{float(ref['structures_per_s']):>10.1f} {ratio:>5.2f}x   "
              f"{float(ours['energy_mae_mev_per_atom']):>12.2f} / {float(ref['energy_mae_mev_per_atom']):<11.2f}"
              f"   {float(ours['forces_mae_mev_per_a']):>10.1f} / {float(ref['forces_mae_mev_per_a']):<10.1f}")
    ours32 = rows["32-true"][1]
    print(f"  threads: 32-true with 1 thread {float(ours32['structures_per_s']):.1f}, with 2 threads "
          f"{float(threads2['structures_per_s']):.1f} structures/s")
    print(f"  peak resident memory {float(ours32['peak_rss_mib']):.0f} MiB; resident growth from step 50 to "
          f"{ours32['steps']}: {int(ours32['rss_growth_kib'])} KiB")
    print()
    if mace:
        ours_mace, refs, ref_tuned = mace
        ref_sps = statistics.mean(float(r["structures_per_s"]) for r in refs)
        sps = float(ours_mace["structures_per_s"])
        print(f"MACE {ours_mace['hidden']}, l<=3, correlation 3, 2 interactions, 8 Bessel, 5 Å, batch 8, AMSGrad 0.01, "
              f"E:F = 1:100 ({ours_mace['parameters']} parameters, BLAS kernels {ours_mace.get('blas', '?')})")
        print(f"  training step {sps:.1f} structures/s; reference SchNet (reference_schnet.py, before and after) "
              f"{ref_sps:.1f} structures/s; MACE / reference SchNet = {sps / ref_sps:.3f} (target >= 0.25)")
        if ref_tuned:
            t = float(ref_tuned["structures_per_s"])
            print(f"  reference SchNet with OPENBLAS_CORETYPE={ours_mace.get('blas')}: {t:.1f} structures/s "
                  f"(MACE / that = {sps / t:.3f})")
        print(f"  best validation force MAE within {ours_mace['epochs']} epochs: "
              f"{float(ours_mace['best_forces_mae_mev_per_a']):.2f} meV/Å at epoch {ours_mace['best_epoch']} "
              f"(target <= 10); energy {float(ours_mace['best_energy_mae_mev_per_atom']):.1f} meV/atom")
        print()
    ours_nl = float(scaling[0]["nl_us_per_atom"]) * int(scaling[0]["atoms"]) / 1000.0
    print(f"neighbor list, {nl_atoms}-atom cells, 5 Å: ours {ours_nl:.3f} ms, ASE {nl_ase_ms:.2f} ms "
          f"per structure ({nl_ase_ms / ours_nl:.0f}x)")
    print(f"hook dispatch: {float(hooks['ns_per_stage_dispatch']):.0f} ns per stage with 10 hooks "
          f"({float(hooks['ns_per_stage_no_hooks']):.0f} ns with none, "
          f"{float(hooks['ns_per_hook_call']):.0f} ns per hook call)")
    print(f"Python hooks: {float(py_call['python_hook']):.2f} µs per call of an empty crucible.Hook, "
          f"{float(py_call['python_update_hook']):.2f} µs of an empty TrainingUpdateHook "
          f"({float(py_call['cpp_lambda']) * 1000:.0f} ns for a C++ hook); in a {py_run['steps']}-step TiAl run with "
          f"both on every stage ({py_run['calls']} calls): {float(py_run['us_per_stage_call']):.1f} µs per call, "
          f"{float(py_run['overhead_pct']):.1f}% of the run")
    print(f"memory over 10000 training steps (small model, 10 hooks): resident {int(hooks['rss_kib_step_1000'])} KiB "
          f"after step 1000, {int(hooks['rss_kib_step_10000'])} KiB after step 10000")
    print()
    print("time per atom against size (fcc Cu, 5 Å, float32 SchNet energy + forces):")
    print(f"  {'atoms':>6} {'edges':>9} {'neighbor list µs/atom':>22} {'model µs/atom':>14}")
    for s in scaling:
        print(f"  {int(s['atoms']):>6} {int(s['edges']):>9} {float(s['nl_us_per_atom']):>22.3f} "
              f"{float(s['model_us_per_atom']):>14.2f}")


if __name__ == "__main__":
    main()
