#!/usr/bin/python3
"""Train the Python reference SchNet (reference_schnet.py, unchanged layers and
loss) for a fixed number of steps on a training split and report its speed
and its validation energy / force MAE, for side-by-side ratios with Crucible
(bench/run_benchmarks.sh).

Usage: /usr/bin/python3 reference_train_eval.py DATA.extxyz --steps N [--bs 8]
       [--bf16] [--valid 50] [--seed 0]
Prints one line: 'reference precision=... structures_per_s=... ms_per_step=...
energy_mae_mev_per_atom=... forces_mae_mev_per_a=...'.
The first --valid frames are the validation set (Crucible's bench uses the
same split); timing is the median step after 5 warm-up steps, as in
reference_schnet.py. Needs Debian's python3-torch and python3-ase.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
from ase.io import read

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_schnet as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--force-weight", type=float, default=10.0)
    ap.add_argument("--valid", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    frames = read(a.data, index=":")
    data = ref.featurize(frames, 5.0)
    valid, train = data[:a.valid], data[a.valid:]
    e_mean = float(np.mean([d["e"] / len(d["z"]) for d in train]))
    model = ref.SchNet(64, 3, 20, 5.0)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    rng = np.random.default_rng(a.seed)
    order, cursor, times = rng.permutation(len(train)), 0, []
    for step in range(a.steps):
        if cursor + a.bs > len(order):
            order, cursor = rng.permutation(len(train)), 0
        z, pos, i, j, sh, g, e, f, n = ref.collate([train[k] for k in order[cursor:cursor + a.bs]])
        cursor += a.bs
        t0 = time.perf_counter()
        pos = pos.clone().requires_grad_(True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            energy = model(z, pos, i, j, sh, g, len(n)) + e_mean * n
            forces = -torch.autograd.grad(energy.sum(), pos, create_graph=True)[0]
            loss = (((energy.float() - e) / n) ** 2).mean() + \
                a.force_weight * ((forces.float() - f) ** 2).mean()
        loss.backward()
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    e_err, f_err, n_f = 0.0, 0.0, 0
    for k in range(0, len(valid), a.bs):
        z, pos, i, j, sh, g, e, f, n = ref.collate(valid[k:k + a.bs])
        pos = pos.clone().requires_grad_(True)
        energy = model(z, pos, i, j, sh, g, len(n)) + e_mean * n
        forces = -torch.autograd.grad(energy.sum(), pos)[0]
        e_err += float((((energy.detach().double() - e.double()) / n.double()).abs()).sum())
        f_err += float((forces.detach().double() - f.double()).abs().sum())
        n_f += f.numel()
    ms = 1000.0 * float(np.median(times))
    print(f"reference precision={'bf16-mixed' if a.bf16 else '32-true'} "
          f"structures_per_s={a.bs * 1000.0 / ms:.2f} ms_per_step={ms:.2f} "
          f"energy_mae_mev_per_atom={1000.0 * e_err / len(valid):.3f} "
          f"forces_mae_mev_per_a={1000.0 * f_err / n_f:.3f}")


if __name__ == "__main__":
    main()
