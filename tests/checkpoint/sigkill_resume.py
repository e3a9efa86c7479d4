#!/usr/bin/env python3
"""Kill a training run with SIGKILL at random moments and resume it each time.

Issue 5 acceptance: every resume must succeed from the newest complete
checkpoint, and the final validation metrics must equal those of an
uninterrupted run (the continuation is exact, so they are bit-identical).

Usage: sigkill_resume.py CRUCIBLE_BINARY WORK_DIR [--kills N] [--seed S]
Checkpoints are written after every optimizer step, so many kills land in
the middle of a checkpoint write. Exit status 0 on success; otherwise the
reason is printed.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

ARGS = [
    "training.num_epochs=6", "training.batch_size=8", "model.schnet.hidden_channels=8",
    "model.schnet.num_filters=8", "model.schnet.num_interactions=1", "model.schnet.num_gaussians=8",
    "output.checkpoint_every_n_steps=1", "output.keep_last_checkpoints=2",
    "data.valid_fraction=0.05",
]


def train(binary, run_dir, extra):
    return subprocess.Popen([binary, "train", f"output.run_dir={run_dir}", *ARGS, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def metrics_without_times(run_dir):
    """metrics.csv without elapsed_s, metrics.jsonl without elapsed_s, summary.json
    without wall time and directory (issue 15: equal after kills and resumes)."""
    csv_rows = []
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        for line in f.read().splitlines():
            cols = line.split(",")
            csv_rows.append(cols[:2] + cols[3:])
    jsonl = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f.read().splitlines():
            j = json.loads(line)
            j.pop("elapsed_s", None)
            jsonl.append(j)
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    summary.pop("wall_time_s", None)
    summary.pop("run_dir", None)
    return {"metrics.csv": csv_rows, "metrics.jsonl": jsonl, "summary.json": summary}


def resumable(run_dir):
    return os.path.exists(os.path.join(run_dir, "checkpoints", "manifest.json"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("work_dir")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    shutil.rmtree(a.work_dir, ignore_errors=True)
    os.makedirs(a.work_dir)

    ref_dir = os.path.join(a.work_dir, "reference")
    t0 = time.time()
    ref = train(a.binary, ref_dir, [])
    out, err = ref.communicate()
    duration = time.time() - t0
    if ref.returncode != 0:
        print("reference run failed:", err)
        return 1
    reference = json.load(open(os.path.join(ref_dir, "summary.json")))["validation"]

    run_dir = os.path.join(a.work_dir, "killed")
    kills = resumes = fresh_starts = 0
    while True:
        if os.path.exists(os.path.join(run_dir, "summary.json")):
            break
        if resumable(run_dir):
            proc = subprocess.Popen([a.binary, "train", "--resume", run_dir],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            resumes += 1
        else:  # killed before the first checkpoint existed: start again
            proc = train(a.binary, run_dir, ["output.overwrite=true"])
            fresh_starts += 1
        if kills < a.kills:
            # Startup (reading data, neighbor lists) takes ~0.5 s; kill
            # somewhere in the first ~1.5 s of each process.
            time.sleep(rng.uniform(0.3, 1.6))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.communicate()
            continue
        out, err = proc.communicate()
        if proc.returncode != 0:
            print(f"a run after {kills} kills failed (rc {proc.returncode}):\n{err}")
            return 1
    got = json.load(open(os.path.join(run_dir, "summary.json")))["validation"]
    print(f"{kills} SIGKILLs, {resumes} resumes, {fresh_starts} starts from scratch; "
          f"reference run {duration:.1f} s")
    for key in ("energy_mae", "forces_mae", "stress_mae"):
        print(f"  {key}: uninterrupted {reference[key]!r}, killed and resumed {got[key]!r}")
        if reference[key] != got[key]:
            print("MISMATCH")
            return 1
    print("final metrics identical")
    want, have = metrics_without_times(ref_dir), metrics_without_times(run_dir)
    for name in want:
        if want[name] != have[name]:
            print(f"{name} differs from the uninterrupted run's (elapsed times aside)")
            return 1
    print("metrics.csv, metrics.jsonl and summary.json identical apart from elapsed times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
