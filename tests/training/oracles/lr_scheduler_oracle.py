#!/usr/bin/env python3
"""Reference learning rates from PyTorch's own torch.optim.lr_scheduler.

Run with the Python that has torch (CRUCIBLE_PYTHON, /usr/bin/python3).

Usage:
  lr_scheduler_oracle.py CASE [CASE ...]
CASE: "KIND:STEPS:ARGS", ARGS comma-separated numbers:
  step:N:step_size,gamma
  exponential:N:gamma
  cosine:N:t_max,final_factor            (eta_min = base * final_factor)
  warmup_cosine:N:warmup,start_factor,t_max,final_factor
                  (SequentialLR([LinearLR(start_factor, 1, warmup),
                                 CosineAnnealingLR(t_max, eta_min)], [warmup]))
  plateau:0:factor,patience,threshold,cooldown,min_lr,m1,m2,...
                  (ReduceLROnPlateau, mode min, rel; stepped with m1, m2, ...)
The optimizer is SGD with two param groups, base lrs 0.1 and 0.03.
Prints one line per case: the lr of both groups before the first step and
after every step ("g0 g1 g0 g1 ...", %.17g).
"""
import sys
import warnings

import torch
from torch.optim import lr_scheduler as ls

warnings.filterwarnings("ignore")
BASE = (0.1, 0.03)


def optimizer():
    p = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    return torch.optim.SGD([{"params": [p[0]], "lr": BASE[0]},
                            {"params": [p[1]], "lr": BASE[1]}], lr=BASE[0])


def lrs(opt):
    return [g["lr"] for g in opt.param_groups]


def run(case):
    kind, steps, args = case.split(":")
    steps = int(steps)
    a = [float(x) for x in args.split(",")] if args else []
    opt = optimizer()
    out = []
    if kind == "plateau":
        factor, patience, threshold, cooldown, min_lr = a[:5]
        s = ls.ReduceLROnPlateau(opt, mode="min", factor=factor, patience=int(patience),
                                 threshold=threshold, threshold_mode="rel",
                                 cooldown=int(cooldown), min_lr=min_lr)
        out += lrs(opt)
        for m in a[5:]:
            opt.step()
            s.step(m)
            out += lrs(opt)
        return out
    if kind == "step":
        s = ls.StepLR(opt, step_size=int(a[0]), gamma=a[1])
    elif kind == "exponential":
        s = ls.ExponentialLR(opt, gamma=a[0])
    elif kind == "cosine":
        # PyTorch's eta_min is one absolute value for all groups: only group
        # 0 matches Crucible's per-group eta_min = base * final_factor.
        s = ls.CosineAnnealingLR(opt, T_max=int(a[0]), eta_min=BASE[0] * a[1])
    elif kind == "warmup_cosine":
        w, f0, t_max, ff = int(a[0]), a[1], int(a[2]), a[3]
        warm = ls.LinearLR(opt, start_factor=f0, end_factor=1.0, total_iters=w)
        cos = ls.CosineAnnealingLR(opt, T_max=t_max, eta_min=BASE[0] * ff)
        s = ls.SequentialLR(opt, [warm, cos], milestones=[w])
    else:
        raise SystemExit("unknown kind " + kind)
    out += lrs(opt)
    for _ in range(steps):
        opt.step()
        s.step()
        out += lrs(opt)
    return out


def main():
    for case in sys.argv[1:]:
        print(" ".join("%.17g" % v for v in run(case)))


if __name__ == "__main__":
    main()
