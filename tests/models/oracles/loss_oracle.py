#!/usr/bin/env python3
"""Reference loss values and gradients from PyTorch (torch.nn.functional).

Run with the Python that has torch (CRUCIBLE_PYTHON, /usr/bin/python3).

Usage: loss_oracle.py   (no arguments)

Builds a fixed float64 batch of 5 structures (2, 1, 3, 4, 2 atoms) with
unlabelled items (labels 0, predictions NaN there), per-structure weights,
per-property weights and config_type weights (MACE's config_type_weights: a
structure's weight times the weight of its config_type, 1 if not listed), and
evaluates every loss kind independently of Crucible: the labelled items are
selected with boolean indexing, the penalty is F.mse_loss / F.l1_loss /
F.huber_loss(reduction="none", delta) against the reference (or against 0 on
the per-atom force-error norm torch.linalg.vector_norm in "vector" mode), and
the result is Σ w_i ℓ_i / (number of labelled items) (x3 for force
components, x9 for stress components).

Output, one record per line, numbers as %.17g:
  num_atoms n_0 ... ; config_types t_0 ... ; ct_weights type w type w ...
  weight / energy_weight / forces_weight / stress_weight  [B]
  has_energy / has_forces / has_stress                    [B] (0/1)
  energy_ref energy_pred [B]; forces_ref forces_pred [N*3]; stress_ref stress_pred [B*9]
  case PROP KIND OPTION DELTA VALUE_CT VALUE_NOCT GRAD...
      PROP energy|forces|stress, KIND mse|mae|huber, OPTION per_atom|total
      (energy), component|vector (forces), - (stress); VALUE_CT with the
      config_type weights, VALUE_NOCT without; GRAD d VALUE_CT / d prediction
      (the whole prediction tensor, row-major; 0 at unlabelled items).
  sum TOTAL   normalized Σ w_k L_k / Σ w_k with config_type weights for
      energy huber per_atom δ=0.3 (w 1), forces mae vector (w 10),
      stress mse (w 100).
"""
import math

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
NAN = float("nan")

NUM_ATOMS = [2, 1, 3, 4, 2]
CONFIG_TYPES = ["bulk", "slab", "bulk", "molecule", "other"]
CT_WEIGHTS = {"bulk": 2.0, "slab": 0.5, "molecule": 0.25, "unused": 7.0}
WEIGHT = [1.0, 2.0, 0.5, 1.5, 1.0]
ENERGY_WEIGHT = [1.0, 0.5, 1.0, 2.0, 1.0]
FORCES_WEIGHT = [2.0, 1.0, 0.5, 1.0, 3.0]
STRESS_WEIGHT = [1.0, 3.0, 1.0, 1.0, 0.25]
HAS_ENERGY = [1, 1, 0, 1, 1]
HAS_FORCES = [1, 0, 1, 1, 1]
HAS_STRESS = [0, 1, 1, 0, 1]
DELTA = {"energy": 0.3, "forces": 0.7, "stress": 0.2}


def fmt(values):
    return " ".join("%.17g" % v for v in values)


def data():
    g = torch.Generator().manual_seed(20240417)
    B, N = len(NUM_ATOMS), sum(NUM_ATOMS)
    batch = torch.repeat_interleave(torch.arange(B), torch.tensor(NUM_ATOMS))
    has_e = torch.tensor(HAS_ENERGY, dtype=torch.bool)
    has_f = torch.tensor(HAS_FORCES, dtype=torch.bool)
    has_s = torch.tensor(HAS_STRESS, dtype=torch.bool)
    amask = has_f[batch]

    e_ref = torch.randn(B, generator=g) * 3.0
    e_pred = e_ref + torch.randn(B, generator=g) * 0.8
    f_ref = torch.randn(N, 3, generator=g)
    f_pred = f_ref + torch.randn(N, 3, generator=g) * 0.6
    f_pred[0] = f_ref[0]  # an atom with zero error (norm gradient at 0)
    s_ref = torch.randn(B, 3, 3, generator=g) * 0.1
    s_pred = s_ref + torch.randn(B, 3, 3, generator=g) * 0.25

    # Unlabelled: labels 0 (as collate), predictions NaN.
    e_ref[~has_e] = 0.0
    e_pred[~has_e] = NAN
    f_ref[~amask] = 0.0
    f_pred[~amask] = NAN
    s_ref[~has_s] = 0.0
    s_pred[~has_s] = NAN
    return batch, has_e, has_f, has_s, e_ref, e_pred, f_ref, f_pred, s_ref, s_pred


def penalty(kind, x, target, delta):
    if kind == "mse":
        return F.mse_loss(x, target, reduction="none")
    if kind == "mae":
        return F.l1_loss(x, target, reduction="none")
    return F.huber_loss(x, target, reduction="none", delta=delta)


def loss(prop, kind, option, delta, tensors, pred, ct):
    batch, has_e, has_f, has_s, e_ref, _, f_ref, _, s_ref, _ = tensors
    w_struct = torch.tensor(WEIGHT)
    ctw = torch.tensor([CT_WEIGHTS.get(t, 1.0) for t in CONFIG_TYPES]) if ct else torch.ones(len(WEIGHT))
    if prop == "energy":
        w = (w_struct * torch.tensor(ENERGY_WEIGHT) * ctw)[has_e]
        d_pred, d_ref = pred[has_e], e_ref[has_e]
        if option == "per_atom":
            n = torch.tensor(NUM_ATOMS, dtype=torch.float64)[has_e]
            d_pred, d_ref = d_pred / n, d_ref / n
        ell = penalty(kind, d_pred, d_ref, delta)
        checks.append((kind, (d_pred - d_ref).abs(), delta))
        return (w * ell).sum() / max(int(has_e.sum()), 1)
    if prop == "forces":
        amask = has_f[batch]
        w = (w_struct * torch.tensor(FORCES_WEIGHT) * ctw)[batch][amask]
        p, r = pred[amask], f_ref[amask]
        m = int(amask.sum())
        if option == "component":
            ell = penalty(kind, p, r, delta)
            checks.append((kind, (p - r).abs(), delta))
            return (w[:, None] * ell).sum() / max(3 * m, 1)
        norm = torch.linalg.vector_norm(p - r, dim=1)
        checks.append((kind, norm, delta))
        ell = penalty(kind, norm, torch.zeros_like(norm), delta)
        return (w * ell).sum() / max(m, 1)
    w = (w_struct * torch.tensor(STRESS_WEIGHT) * ctw)[has_s]
    p, r = pred[has_s], s_ref[has_s]
    ell = penalty(kind, p, r, delta)
    checks.append((kind, (p - r).abs(), delta))
    return (w[:, None, None] * ell).sum() / max(9 * int(has_s.sum()), 1)


checks = []


def main():
    t = data()
    batch, has_e, has_f, has_s, e_ref, e_pred, f_ref, f_pred, s_ref, s_pred = t
    print("num_atoms", fmt(NUM_ATOMS))
    print("config_types", " ".join(CONFIG_TYPES))
    print("ct_weights", " ".join("%s %.17g" % kv for kv in CT_WEIGHTS.items()))
    print("weight", fmt(WEIGHT))
    print("energy_weight", fmt(ENERGY_WEIGHT))
    print("forces_weight", fmt(FORCES_WEIGHT))
    print("stress_weight", fmt(STRESS_WEIGHT))
    print("has_energy", fmt(HAS_ENERGY))
    print("has_forces", fmt(HAS_FORCES))
    print("has_stress", fmt(HAS_STRESS))
    print("energy_ref", fmt(e_ref.tolist()))
    print("energy_pred", fmt(e_pred.tolist()))
    print("forces_ref", fmt(f_ref.flatten().tolist()))
    print("forces_pred", fmt(f_pred.flatten().tolist()))
    print("stress_ref", fmt(s_ref.flatten().tolist()))
    print("stress_pred", fmt(s_pred.flatten().tolist()))

    preds = {"energy": e_pred, "forces": f_pred, "stress": s_pred}
    options = {"energy": ["per_atom", "total"], "forces": ["component", "vector"], "stress": ["-"]}
    for prop in ("energy", "forces", "stress"):
        for kind in ("mse", "mae", "huber"):
            for option in options[prop]:
                delta = DELTA[prop]
                p = preds[prop].clone().requires_grad_(True)
                value = loss(prop, kind, option, delta, t, p, ct=True)
                value.backward()
                with torch.no_grad():
                    noct = loss(prop, kind, option, delta, t, preds[prop], ct=False)
                grad = p.grad.flatten().tolist()
                assert all(math.isfinite(x) for x in grad)
                print("case", prop, kind, option, "%.17g" % delta, "%.17g" % value.item(),
                      "%.17g" % noct.item(), fmt(grad))

    # Every Huber case must exercise both branches (|d| < delta and >= delta).
    for kind, d, delta in checks:
        if kind == "huber":
            assert bool((d < delta).any()) and bool((d >= delta).any()), (d, delta)

    terms = [(1.0, loss("energy", "huber", "per_atom", DELTA["energy"], t, e_pred, True)),
             (10.0, loss("forces", "mae", "vector", DELTA["forces"], t, f_pred, True)),
             (100.0, loss("stress", "mse", "-", DELTA["stress"], t, s_pred, True))]
    total = sum(w * v for w, v in terms) / sum(w for w, _ in terms)
    print("sum", "%.17g" % total.item())


if __name__ == "__main__":
    main()
