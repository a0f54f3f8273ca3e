"""Where a group's training loop spends its time, per run-step: R runs of a preset trained as
one group in this process (one core, one thread), first unprofiled (collection and update from
the runs' own ``time_collect`` / ``time_update``), then under ``cProfile`` for the split of the
update (cProfile adds its own cost to every Python call, so read its column as shares).

Usage:
    python benchmarks/profile_group.py [--preset klip/cartpole] [--runs 20] [--steps 51200]
        [--cpu 0]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import logging
import os
import pstats
import tempfile

#: (label, function as pstats names it: file suffix and function name), cumulative time
PARTS = [
    ("collection (all of it)", "engine/collect.py", "collect"),
    ("  env steps and their checks and bookkeeping", "engine/collect.py", "_step"),
    ("update (all of it)", "engine/learn.py", "update_rows"),
    ("  minibatch steps", "engine/numpy_stack.py", "step"),
    ("    MLP forwards (update and collection)", "numpy/mlp.py", "forward"),
    ("    MLP backwards", "numpy/mlp.py", "backward"),
    ("    Adam (clip and step)", "numpy/adam.py", "step"),
    ("    heads and closed-form losses, by family", "engine/numpy_stack.py", "_family_loss"),
    ("  early-stop / actuator checks per run", "engine/learn.py", "skips"),
    ("  per-run update metrics", "engine/learn.py", "result"),
    ("rollout KLs", "engine/learn.py", "policy_kls"),
]


def configs(args: argparse.Namespace, root: str) -> list:
    import klppo.rl as rl

    def cfg(seed: int):
        c = rl.preset(args.preset)
        return dataclasses.replace(c, seed=seed, objective="clip", total_steps=args.steps,
                                   tensorboard=False, out=os.path.join(root, f"run{seed}"))
    return [cfg(s) for s in range(args.runs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="klip/cartpole")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=51200)
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    logging.disable(logging.WARNING)
    import klppo.rl as rl

    run_steps = args.runs * args.steps
    with tempfile.TemporaryDirectory() as d:
        rs = rl.train_batched(configs(args, os.path.join(d, "plain")))
        loop = max(r.metrics[-1]["time_elapsed"] for r in rs)
        coll = sum(m["time_collect"] for m in rs[0].metrics) * args.runs
        upd = sum(m["time_update"] for m in rs[0].metrics) * args.runs
        print(f"{args.preset}: {args.runs} runs x {args.steps} steps, one group, cpu {args.cpu}")
        print(f"unprofiled, us per run-step: loop {loop / run_steps * 1e6:.1f} = collection "
              f"{coll / run_steps * 1e6:.1f} + update {upd / run_steps * 1e6:.1f} + the rest "
              f"{(loop - coll - upd) / run_steps * 1e6:.1f}")
        prof = cProfile.Profile()
        cfgs = configs(args, os.path.join(d, "profiled"))
        prof.runcall(rl.train_batched, cfgs)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    print("under cProfile, us per run-step (cumulative time of each):")
    for label, path, name in PARTS:
        t = sum(v[3] for (f, _, fn), v in stats.items() if f.endswith(path) and fn == name)
        print(f"  {label:<48} {t / run_steps * 1e6:7.2f}")


if __name__ == "__main__":
    main()
