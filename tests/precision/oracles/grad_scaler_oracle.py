#!/usr/bin/env python3
"""Reference scale sequence from PyTorch's own GradScaler bookkeeping.

Run with the Python that has torch (CRUCIBLE_PYTHON, /usr/bin/python3).

PyTorch 1.13's torch.cuda.amp.GradScaler disables itself without CUDA, and
its fused update kernel (torch._amp_update_scale_) has only a CUDA backend.
This oracle therefore enables the real GradScaler object on CPU and swaps in
a CPU version of the update kernel, transcribed from the rule of
aten/src/ATen/native/cuda/AmpKernels.cu (amp_update_scale_cuda_kernel).
Everything else -- combining the found_inf flags of several optimizers,
clearing per-optimizer state, state_dict()/load_state_dict() -- is PyTorch's
Python code.

Usage:
  grad_scaler_oracle.py CASE [CASE ...]
CASE: "INIT:GROWTH:BACKOFF:INTERVAL:FLAGS:RESUME_AT".
FLAGS: comma-separated iterations; each is one character per optimizer,
'1' if that optimizer's gradients held inf/NaN, e.g. "00,01,00".
RESUME_AT: after that many iterations, continue with a fresh (default)
scaler that loads the first one's state_dict(); -1 for never.
Prints one line per case: "<scale> <growth_tracker>" after every update(),
all on that line (scale as %.9g, which round-trips float32).
"""
import sys
import warnings

import torch
from torch.cuda.amp import grad_scaler as gs


def cpu_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor,
                          backoff_factor, growth_interval):
    # float32 scale times a double factor, rounded back to float32.
    if found_inf.item():
        scale.fill_(float(torch.tensor(scale.item() * backoff_factor,
                                       dtype=torch.float32)))
        growth_tracker.fill_(0)
    else:
        successful = int(growth_tracker.item()) + 1
        if successful == growth_interval:
            new_scale = torch.tensor(scale.item() * growth_factor,
                                     dtype=torch.float32)
            if torch.isfinite(new_scale):
                scale.fill_(float(new_scale))
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


def make_scaler(init, growth, backoff, interval):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = gs.GradScaler(init_scale=init, growth_factor=growth,
                          backoff_factor=backoff, growth_interval=interval,
                          enabled=False)
    # Re-run the enabled branch of __init__ (skipped without CUDA).
    s._enabled = True
    s._init_scale = init
    s._scale = None
    s._growth_factor = growth
    s._backoff_factor = backoff
    s._growth_interval = interval
    s._init_growth_tracker = 0
    s._growth_tracker = None
    s._per_optimizer_states = gs.defaultdict(gs._refresh_per_optimizer_state)
    return s


def run_case(case):
    init, growth, backoff, interval, flags, resume_at = case.split(":")
    init, growth, backoff = float(init), float(growth), float(backoff)
    interval, resume_at = int(interval), int(resume_at)
    iterations = flags.split(",")
    out = []
    scaler = make_scaler(init, growth, backoff, interval)
    cpu = torch.device("cpu")
    for it, flags in enumerate(iterations):
        if it == resume_at:
            state = scaler.state_dict()
            scaler = make_scaler(65536.0, 2.0, 0.5, 2000)
            scaler.load_state_dict(state)
        if scaler._scale is None:
            scaler._lazy_init_scale_growth_tracker(cpu)
        for opt_id, flag in enumerate(flags):
            st = scaler._per_optimizer_states[opt_id]
            st["found_inf_per_device"] = {
                cpu: torch.full((1,), float(flag == "1"), dtype=torch.float32)}
            st["stage"] = gs.OptState.STEPPED
        scaler.update()
        out.append("%.9g %d" % (scaler.get_scale(), scaler._get_growth_tracker()))
    print(" ".join(out))


def main():
    torch._amp_update_scale_ = cpu_amp_update_scale_
    for case in sys.argv[1:]:
        run_case(case)


if __name__ == "__main__":
    main()
