#!/usr/bin/python3
"""What a Python hook costs the C++ training loop (issue 49).

Prints µs per call of an empty hook on one stage (the adapter: take the GIL,
build ctx, call Python, release) for a C++ LambdaHook, a Python crucible.Hook
and a Python crucible.TrainingUpdateHook, then the same figure inside real
runs: the default SchNet recipe on the bundled TiAl data, 1 thread, with and
without an empty Python hook on every stage it may take (16 stages) and an
empty update hook on the 5 update stages, in alternating rounds.

Usage: /usr/bin/python3 bench/bench_python_hooks.py [--build build] [--steps 300] [--rounds 3]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_benchmarks import cpu_flags, cpu_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200000)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, os.path.join(a.build, "python"))
    import crucible
    from crucible import _crucible
    S = crucible.TrainingStage

    class Empty(crucible.Hook):
        stages = {s for s in S.__members__.values() if s not in (S.DO_BACKWARD, S.DO_OPTIMIZER_STEP)}

        def __init__(self):
            self.calls = 0

        def __call__(self, ctx, stage):
            self.calls += 1

    class EmptyUpdate(crucible.TrainingUpdateHook):
        def __init__(self):
            self.calls = 0

        def __call__(self, ctx, stage, will_skip):
            self.calls += 1
            return True

    cpp = _crucible._time_cpp_hook(a.calls)
    timed, timed_update = Empty(), EmptyUpdate()
    py_hook = _crucible._time_hook(timed, "hook", a.calls)
    py_update = _crucible._time_hook(timed_update, "update", a.calls)
    assert timed.calls == a.calls and timed_update.calls == a.calls, "every timed call reached Python"

    recipe = {"training": {"num_steps": a.steps, "num_threads": 1}, "output": {"overwrite": True}}
    plain, hooked, calls = [], [], 0
    with tempfile.TemporaryDirectory() as work:
        for _ in range(a.rounds):
            for with_hooks in (False, True):
                hooks = [Empty(), EmptyUpdate()] if with_hooks else []
                t0 = time.perf_counter()
                crucible.train(recipe, hooks=hooks, run_dir=os.path.join(work, "run"))
                dt = time.perf_counter() - t0
                (hooked if with_hooks else plain).append(dt)
                if with_hooks:
                    calls = sum(h.calls for h in hooks)
    t_plain, t_hooked = statistics.median(plain), statistics.median(hooked)
    print(f"CPU: {cpu_model()}; flags: {cpu_flags()}")
    print(f"python_hook_us_per_call cpp_lambda={cpp:.3f} python_hook={py_hook:.3f} python_update_hook={py_update:.3f}")
    print(f"python_hook_in_run steps={a.steps} rounds={a.rounds} calls={calls} run_s_without={t_plain:.3f} "
          f"run_s_with={t_hooked:.3f} us_per_stage_call={1e6 * (t_hooked - t_plain) / max(calls, 1):.2f} "
          f"overhead_pct={100.0 * (t_hooked - t_plain) / t_plain:.1f}")


if __name__ == "__main__":
    main()
