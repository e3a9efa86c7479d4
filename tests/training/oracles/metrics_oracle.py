#!/usr/bin/env python3
"""Validation metrics computed directly with PyTorch (independent oracle).

Run with the Python that has torch (CRUCIBLE_PYTHON, /usr/bin/python3).

Usage: metrics_oracle.py FILE.json
FILE: {"structures": [{"config_type": str, "num_atoms": int,
        "energy": [pred, ref] or null, "forces": [[pred...3N], [ref...3N]] or null,
        "stress": [[pred...9], [ref...9]] or null}, ...]}
Prints JSON {"<group>": {metric: value}} for group "all" and each config_type:
energy MAE/RMSE per atom in meV/atom, forces MAE/RMSE over components and the
zero-forces MAE in meV/Å, the mean-energy RMSE (standard deviation of the
reference energies per atom) in meV/atom, stress MAE/RMSE over the 9
components in meV/Å^3;
NaN (as null) when a group has no such label.
"""
import json
import math
import sys

import torch


def metrics(items):
    e = [(s["energy"][0] - s["energy"][1]) / s["num_atoms"] for s in items if s["energy"]]
    fp = [torch.tensor(s["forces"][0], dtype=torch.float64) for s in items if s["forces"]]
    fr = [torch.tensor(s["forces"][1], dtype=torch.float64) for s in items if s["forces"]]
    sp = [torch.tensor(s["stress"][0], dtype=torch.float64) for s in items if s["stress"]]
    sr = [torch.tensor(s["stress"][1], dtype=torch.float64) for s in items if s["stress"]]
    out = {}

    def put(name, pred, ref):
        if pred is None:
            out[name + "_mae"] = None
            out[name + "_rmse"] = None
            return
        err = pred - ref
        out[name + "_mae"] = 1000.0 * torch.mean(torch.abs(err)).item()
        out[name + "_rmse"] = 1000.0 * math.sqrt(torch.mean(err ** 2).item())

    et = torch.tensor(e, dtype=torch.float64) if e else None
    put("energy", et, torch.zeros_like(et) if et is not None else None)
    # Spread of the labels per atom: the RMSE of predicting their mean
    # (torch.std with correction 0 = population standard deviation).
    ref = [s["energy"][1] / s["num_atoms"] for s in items if s["energy"]]
    out["mean_energy_rmse"] = (1000.0 * torch.tensor(ref, dtype=torch.float64).std(unbiased=False).item()
                               if ref else None)
    if fp:
        put("forces", torch.cat(fp), torch.cat(fr))
        out["zero_forces_mae"] = 1000.0 * torch.mean(torch.abs(torch.cat(fr))).item()
    else:
        put("forces", None, None)
        out["zero_forces_mae"] = None
    put("stress", torch.cat(sp) if sp else None, torch.cat(sr) if sr else None)
    return out


def main():
    data = json.load(open(sys.argv[1]))["structures"]
    result = {"all": metrics(data)}
    for t in sorted({s["config_type"] for s in data}):
        result[t] = metrics([s for s in data if s["config_type"] == t])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
