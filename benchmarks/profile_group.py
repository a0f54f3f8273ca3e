"""Where a group's training loop spends its time, per run-step: R runs of a preset trained as
one group in this process (one core, one thread), first unprofiled (collection and update from
the runs' own ``time_collect`` / ``time_update``), then under ``cProfile`` for the split of the
update (cProfile adds its own cost to every Python call, so read its column as shares), and last the
arithmetic floor: the update's stacked MLP forwards and backwards and its Adam step alone (klppo's
own functions on random weights of the preset's network shape, no engine around them), the part
of a run-step no reorganisation of the engine removes while the numbers stay those of today.

Usage:
    python benchmarks/profile_group.py [--preset klip/cartpole] [--runs 20] [--steps 51200]
        [--cpu 0] [--env-backend gymnasium|envpool]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import logging
import os
import pstats
import statistics
import tempfile
import time
from typing import Any

#: (label, function as pstats names it: file suffix and function name), cumulative time
PARTS = [
    ("collection (all of it)", "engine/collect.py", "collect"),
    ("  env steps and their checks and bookkeeping", "engine/collect.py", "_step"),
    ("    of it: EnvPool's own step (its C++ pool and the autoreset)", "rl/envpool_backend.py",
     "same_step"),
    ("update (all of it)", "engine/learn.py", "update_rows"),
    ("  minibatch steps", "engine/numpy_stack.py", "step"),
    ("    MLP forwards (update and collection)", "numpy/mlp.py", "forward"),
    ("    MLP backwards", "numpy/mlp.py", "backward"),
    ("    Adam (clip and step)", "numpy/adam.py", "step"),
    ("    heads and closed-form losses, by family", "engine/numpy_stack.py", "_family_loss"),
    ("  early-stop / actuator checks per run", "engine/learn.py", "skips"),
    ("  the diagnostics (families of rows)", "engine/learn.py", "diagnostics_rows"),
    ("  per-run update metrics", "engine/learn.py", "result"),
    ("advantages (GAE per group of rollouts)", "engine/advantages.py", "group_gae"),
    ("rollout KLs", "engine/learn.py", "policy_kls"),
]


def configs(args: argparse.Namespace, root: str) -> list:
    import klppo.rl as rl

    def cfg(seed: int):
        c = rl.preset(args.preset)
        c = dataclasses.replace(c, seed=seed, objective="clip", total_steps=args.steps,
                                tensorboard=False, out=os.path.join(root, f"run{seed}"))
        c.rollout = dataclasses.replace(c.rollout, env_backend=args.env_backend)
        return c
    return [cfg(s) for s in range(args.runs)]


def arithmetic_floor(cfg: Any, runs: int, reps: int = 200) -> float:
    """Seconds per run-step of the update's stacked arithmetic alone: one minibatch of every
    row through actor and critic forward and backward (``klppo.nn.numpy.mlp``) and one
    ``NumpyAdam`` step, median of ``reps``, times the minibatch steps per run-step."""
    import gymnasium as gym
    import numpy as np

    from klppo.nn.actor_critic import ActorCritic, make_head
    from klppo.nn.numpy import flat_weights, mlp
    from klppo.nn.numpy.adam import NumpyAdam
    from klppo.rl.engine.rows import Layout

    env = gym.make(cfg.env)
    obs_dim = int(np.prod(env.observation_space.shape))
    agent = ActorCritic(obs_dim, make_head(env.action_space), cfg.net.hidden)
    env.close()
    rng = np.random.default_rng(0)
    P = sum(p.numel() for p in agent.parameters())
    W = (rng.standard_normal((runs, P)) * 0.1).astype(np.float32)
    G = np.zeros_like(W)
    layout = Layout(agent, flat_weights(agent, W[0].copy()).span)
    actor, critic = layout.layers(W)
    g_actor, g_critic = layout.layers(G)
    adam = NumpyAdam(W, np.full(runs, 3e-4), np.full(runs, 1e-5), np.full(runs, 0.5))
    n = cfg.ppo.minibatch_size
    x = rng.standard_normal((runs, n, obs_dim)).astype(np.float32)
    ws = mlp.Workspace()

    def minibatch() -> None:
        a = mlp.forward(actor, x, ws, "actor")
        c = mlp.forward(critic, x, ws, "critic")
        mlp.backward(actor, g_actor, a, np.ones_like(a[-1]), ws)
        mlp.backward(critic, g_critic, c, np.ones_like(c[-1]), ws)
        adam.step(G)

    times = []
    for _ in range(reps):
        t = time.perf_counter()
        minibatch()
        times.append(time.perf_counter() - t)
    per_run_step = cfg.ppo.update_epochs / (n * runs)  # minibatch steps per run-step
    return statistics.median(times) * per_run_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="klip/cartpole")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=51200)
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--env-backend", default="gymnasium", choices=["gymnasium", "envpool"])
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
        print(f"{args.preset} on {args.env_backend}: {args.runs} runs x {args.steps} steps, one "
              f"group, cpu {args.cpu}")
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
    floor = arithmetic_floor(configs(args, "unused")[0], args.runs)
    print(f"arithmetic floor (the update's stacked MLP forwards, backwards and Adam alone, "
          f"unprofiled): {floor * 1e6:.2f} us per run-step")


if __name__ == "__main__":
    main()
