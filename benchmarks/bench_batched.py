"""The batched engine against the ordinary one: R runs in one process vs R processes in a row.

Usage: python benchmarks/bench_batched.py [--preset klip/hopper] [--runs 20] [--steps 8192]
                                          [--cpu 0] [--repeats 1] [--env-backend gymnasium]

Both engines train the same R runs (the preset, seeds 0..R-1, objective clip) on ONE core (every
process pinned to ``--cpu`` with sched_setaffinity, one BLAS and one torch thread): the
ordinary engine as R processes one after another (what ``klppo sweep --engine process
--workers 1`` does), the batched engine as one process (``klppo sweep --engine batched``). Each
process is timed from its start to its exit (imports included: "wall"); the training loop alone
is read from the runs' metrics ("loop": ``time_elapsed`` of each run's last iteration, summed over
the ordinary runs; the longest of the batched runs, which iterate together). The script prints
the summed env-steps per second of both and their ratio, checks that both engines wrote the same
metrics for every run (timing fields aside), and measures the bare env step of the backend (the
Gymnasium env alone, and klppo's vector env around it, with random actions) to give each engine's
overhead per run-step in microseconds above it. ``--env-backend envpool`` runs both engines on
EnvPool's task (``pip install 'klppo[envpool]'``) and takes EnvPool's own step as the bare one.
Needs the env's extra (mujoco for klip/hopper).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from _proc import run

PIN = "import os; os.sched_setaffinity(0, {{{cpu}}})\n"

CONFIGS = PIN + """
import dataclasses, logging, klppo.rl as rl
logging.disable(logging.WARNING)
def cfg(seed):
    c = rl.preset({preset!r})
    return dataclasses.replace(c, seed=seed, objective="clip", total_steps={steps},
                               tensorboard=False, out=os.path.join({root!r}, f"run{{seed}}"),
                               rollout=dataclasses.replace(c.rollout, env_backend={backend!r}))
"""

ORDINARY = CONFIGS + """
r = rl.train(cfg({seed}))
print("RESULT", r.metrics[-1]["global_step"], r.metrics[-1]["time_elapsed"])
"""

BATCHED = CONFIGS + """
from klppo.rl.batched import train_batched
rs = train_batched([cfg(s) for s in range({runs})])
assert all(r.status == "finished" for r in rs)
print("RESULT", sum(r.metrics[-1]["global_step"] for r in rs),
      max(r.metrics[-1]["time_elapsed"] for r in rs))
"""

BARE = PIN + """
import time, numpy as np, gymnasium as gym
from klppo.rl.envs import make_vector_env
from klppo.rl.presets import preset
env_id, n, backend = preset({preset!r}).env, 20_000, {backend!r}
e = gym.make(env_id)
e.reset(seed=0)
e.action_space.seed(0)
acts = [e.action_space.sample() for _ in range(256)]
if backend == "envpool":
    import envpool
    e = envpool.make(env_id, env_type="gymnasium", num_envs=1, seed=0)
    e.reset()
    acts = [np.asarray(a, dtype=e.action_space.dtype)[None] for a in acts]
t = time.perf_counter()
for i in range(n):
    _, _, term, trunc, _ = e.step(acts[i % 256])
    if backend == "gymnasium" and (term or trunc):
        e.reset()
gym_us = (time.perf_counter() - t) / n * 1e6
v = make_vector_env(env_id, 1, 0, backend=backend)
vacts = [np.asarray(a).reshape(1, -1) for a in acts]
t = time.perf_counter()
for i in range(n):
    v.step(vacts[i % 256])
vec_us = (time.perf_counter() - t) / n * 1e6
print("RESULT", gym_us, vec_us)
"""


def metrics(run_dir: Path) -> list[dict]:
    drop = {"sps", "time_collect", "time_update", "time_elapsed"}
    return [{k: v for k, v in json.loads(line).items() if k not in drop}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def measure(args: argparse.Namespace) -> tuple[dict[str, tuple[float, float, int]], bool]:
    """Per engine: (wall s, loop s, env steps) of all runs; whether every run's metrics are the
    same in both engines."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        roots = {e: os.path.join(d, e) for e in ("ordinary", "batched")}
        common = dict(cpu=args.cpu, preset=args.preset, steps=args.steps,
                      backend=args.env_backend)
        wall = loop = steps = 0.0
        for seed in range(args.runs):
            w, (s, el) = run(ORDINARY.format(root=roots["ordinary"], seed=seed, **common))
            wall, loop, steps = wall + w, loop + float(el), steps + int(s)
        out["ordinary"] = (wall, loop, int(steps))
        w, (s, el) = run(BATCHED.format(root=roots["batched"], runs=args.runs, **common))
        out["batched"] = (w, float(el), int(s))
        same = all(metrics(Path(roots["ordinary"]) / f"run{s}")
                   == metrics(Path(roots["batched"]) / f"run{s}") for s in range(args.runs))
    return out, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="klip/hopper")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=8192, help="env steps per run")
    ap.add_argument("--cpu", type=int, default=0, help="the one core every process runs on")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--env-backend", choices=["gymnasium", "envpool"], default="gymnasium")
    args = ap.parse_args()
    print(f"{args.preset} on {args.env_backend}: {args.runs} runs x {args.steps} steps (clip, "
          f"seeds 0..{args.runs - 1}), every process on cpu {args.cpu}, one thread")
    print(f"{'engine':<9} {'wall s':>8} {'loop s':>8} {'steps/s wall':>13} {'steps/s loop':>13} "
          f"{'us/run-step loop':>17}")
    _, (gym_us, vec_us) = run(BARE.format(cpu=args.cpu, preset=args.preset,
                                          backend=args.env_backend))
    for _ in range(args.repeats):
        res, same = measure(args)
        rate = {}
        for engine in ("ordinary", "batched"):
            wall, loop, steps = res[engine]
            rate[engine] = (steps / wall, steps / loop, loop / steps * 1e6)
            print(f"{engine:<9} {wall:8.1f} {loop:8.1f} {rate[engine][0]:13.0f} "
                  f"{rate[engine][1]:13.0f} {rate[engine][2]:17.1f}")
        print(f"ratio batched/ordinary (summed env-steps/s): "
              f"{rate['batched'][0] / rate['ordinary'][0]:.2f}x wall (imports included), "
              f"{rate['batched'][1] / rate['ordinary'][1]:.2f}x training loop; "
              f"same metrics per run: {'yes' if same else 'NO'}")
        gym_f, vec_f = float(gym_us), float(vec_us)
        print(f"bare env step: {gym_f:.1f} us ({args.env_backend} alone), {vec_f:.1f} us (klppo's "
              f"vector env); overhead per run-step above the bare step: ordinary "
              f"{rate['ordinary'][2] - gym_f:.1f} us, batched {rate['batched'][2] - gym_f:.1f} us")


if __name__ == "__main__":
    main()
