"""A pickled MACE model (`.model`) for `crucible import mace` (issue 46).

    python3 -m crucible.mace_to_pt MODEL.model OUT.pt            # OUT.pt + OUT.json
    python3 -m crucible.mace_to_pt MODEL.model OUT.pt --import RUN_DIR

A `.model` file is a pickled torch.nn.Module: unpickling it runs MACE's and
e3nn's Python classes, so this needs MACE's Python package importable (where
the model was trained). It writes OUT.pt = torch.save({"model": state_dict})
and OUT.json = MACE's hyper-parameters (mace.tools.scripts_utils.
extract_config_mace_model) with JSON types; `crucible import mace OUT.pt
--hyperparameters OUT.json --out RUN_DIR` (or --import here) reads them with
LibTorch alone. A `_compiled.model` (TorchScript) needs no conversion.

Back to MACE: `crucible export mace RUN_DIR --out OUT.pt` writes OUT.pt and
OUT.json; `load_exported("OUT.pt")` here builds MACE's ScaleShiftMACE from
them (MACE's Python package needed).
"""
import argparse
import json
import os
import sys


def _json_value(value):
    """MACE's hyper-parameter values as JSON: irreps as their string, classes
    and functions by name, arrays and tensors as lists."""
    import numpy as np
    import torch

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ in ("Irreps", "Irrep", "_MulIr"):  # e3nn's are tuples: keep "16x0e+16x1o"
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, type) or callable(value) and hasattr(value, "__name__"):
        return value.__name__
    return str(value)  # e3nn Irreps and the like


def convert(model_path, out_pt):
    """Writes OUT.pt and OUT.json (beside it) from a pickled MACE model.

    Returns (out_pt, out_json). Raises ImportError with the fix when MACE's
    package is not importable, ValueError for a file that is not a MACE model.
    """
    try:
        import torch
        import mace  # noqa: F401  (the pickle refers to its classes)
        from mace.tools.scripts_utils import extract_config_mace_model
    except ImportError as e:
        raise ImportError(
            f"{model_path}: a pickled MACE model needs MACE's Python package ({e}); run this where MACE is "
            "installed, or import the model's _compiled.model with `crucible import mace` instead") from e
    model = torch.load(model_path, map_location="cpu")
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "interactions"):
        raise ValueError(f"{model_path}: is not a pickled MACE model (got {type(model).__name__})")
    config = {k: _json_value(v) for k, v in extract_config_mace_model(model).items()}
    config["avg_num_neighbors"] = [float(block.avg_num_neighbors) for block in model.interactions]
    config["model_class"] = type(model).__name__
    config["versions"] = {"mace": getattr(mace, "__version__", None), "torch": torch.__version__}
    out_json = os.path.splitext(out_pt)[0] + ".json"
    torch.save({"model": model.state_dict()}, out_pt)
    with open(out_json, "w") as f:
        json.dump(config, f, indent=1)
    return out_pt, out_json


def load_exported(pt, hyperparameters=None):
    """MACE's ScaleShiftMACE from `crucible export mace` output (FILE.pt and
    FILE.json beside it), loaded with load_state_dict(strict=True).

    Needs MACE's Python package. Returns the model in the file's dtype.
    """
    import numpy as np
    import torch
    from e3nn import o3
    from mace import modules

    with open(hyperparameters or os.path.splitext(pt)[0] + ".json") as f:
        hp = json.load(f)
    state = torch.load(pt, map_location="cpu")
    dtype = state["node_embedding.linear.weight"].dtype
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = modules.ScaleShiftMACE(
            r_max=hp["r_max"], num_bessel=hp["num_bessel"], num_polynomial_cutoff=hp["num_polynomial_cutoff"],
            max_ell=hp["max_ell"], interaction_cls=modules.interaction_classes[hp["interaction_cls"]],
            interaction_cls_first=modules.interaction_classes[hp["interaction_cls_first"]],
            num_interactions=hp["num_interactions"], num_elements=hp["num_elements"],
            hidden_irreps=o3.Irreps(hp["hidden_irreps"]), MLP_irreps=o3.Irreps(hp["MLP_irreps"]),
            atomic_energies=np.array(hp["atomic_energies"]), avg_num_neighbors=hp["avg_num_neighbors"],
            atomic_numbers=hp["atomic_numbers"], correlation=hp["correlation"], gate=torch.nn.functional.silu,
            radial_MLP=hp["radial_MLP"], radial_type=hp["radial_type"],
            atomic_inter_scale=hp["atomic_inter_scale"], atomic_inter_shift=hp["atomic_inter_shift"],
            heads=hp["heads"], pair_repulsion=hp.get("pair_repulsion", False),
            use_reduced_cg=hp.get("use_reduced_cg", False))
    finally:
        torch.set_default_dtype(previous)
    model.load_state_dict(state, strict=True)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m crucible.mace_to_pt", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="pickled MACE model (.model)")
    parser.add_argument("out", help="state_dict to write (.pt); the JSON goes beside it")
    parser.add_argument("--import", dest="run_dir", help="then import it into this new run directory")
    args = parser.parse_args(argv)
    try:
        pt, hp = convert(args.model, args.out)
    except (ImportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {pt} and {hp}")
    if args.run_dir:
        from ._crucible import import_mace
        print(import_mace(pt, hp, args.run_dir), end="")
    else:
        print(f"next: crucible import mace {pt} --hyperparameters {hp} --out RUN_DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
