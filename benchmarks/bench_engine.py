"""The one engine against klppo as it was: R runs in one group vs the same R runs one process each.

Usage:
    git worktree add /tmp/klppo-base 5e465de   # the code before the one engine (issue #29)
    python benchmarks/bench_engine.py --baseline /tmp/klppo-base [--preset klip/hopper]
        [--runs 20] [--steps 8192] [--cpu 0] [--env-backend gymnasium] [--single] [--study]

The baseline trains the R runs (the preset, seeds 0..R-1, objective clip) as R processes one
after another (``klppo train`` of the baseline's source tree, which ``--baseline`` names: a
directory holding its ``klppo`` package); this tree trains them as one group (``klppo sweep``'s
default: ``klppo.rl.train_batched``). Every process is pinned to ``--cpu`` (one core, one BLAS
and one torch thread) and timed from its start to its exit ("wall", imports included); the
training loop alone is read from the runs' metrics ("loop": ``time_elapsed`` of each run's last
iteration, summed over the baseline's runs, the longest of the group's). It prints the summed
env-steps per second of both, their ratio, whether every run's metrics are equal in both (timing
aside), and each side's cost per run-step above the bare env step. ``--single`` also times one
run alone (R = 1) in both trees, three times each, interleaved. ``--study`` trains the KLip
four-condition study instead (``make demo``'s conditions: clip, per-sample KL, fixed beta 1.0,
the step controller) with ``--runs`` seeds each. Needs the env's extra (mujoco for klip/hopper;
envpool for ``--env-backend envpool``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from _proc import run

PIN = "import os; os.sched_setaffinity(0, {{{cpu}}})\n"

#: the KLip four-condition study (klppo.experiments.sweep_spec.DEMO_SPEC's conditions)
STUDY = [{"objective": "clip"}, {"objective": "per_sample_kl"},
         {"objective": "kl_penalty", "kl": {"controller": "fixed", "beta": 1.0}},
         {"objective": "kl_penalty",
          "kl": {"controller": "step", "preset": "klip", "target": 0.02}}]

CONFIGS = PIN + """
import dataclasses, logging, klppo.rl as rl
logging.disable(logging.WARNING)
RUNS = {plan!r}
def cfg(i):
    seed, over = RUNS[i]
    c = rl.preset({preset!r})
    kl = dataclasses.replace(c.kl, **over.get("kl", {{}}))
    return dataclasses.replace(c, seed=seed, objective=over["objective"], kl=kl,
                               total_steps={steps}, tensorboard=False,
                               out=os.path.join({root!r}, f"run{{i}}"),
                               rollout=dataclasses.replace(c.rollout, env_backend={backend!r}))
"""

ALONE = CONFIGS + """
r = rl.train(cfg({seed}))
print("RESULT", r.metrics[-1]["global_step"], r.metrics[-1]["time_elapsed"])
"""

GROUP = CONFIGS + """
rs = rl.train_batched([cfg(i) for i in range({runs})])
assert all(r.status == "finished" for r in rs)
print("RESULT", sum(r.metrics[-1]["global_step"] for r in rs),
      max(r.metrics[-1]["time_elapsed"] for r in rs))
"""

BARE = PIN + """
import time, numpy as np, gymnasium as gym
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
print("RESULT", (time.perf_counter() - t) / n * 1e6)
"""


def metrics(run_dir: Path) -> list[dict]:
    drop = {"sps", "time_collect", "time_update", "time_elapsed"}
    return [{k: v for k, v in json.loads(line).items() if k not in drop}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def plan(args: argparse.Namespace) -> list[tuple[int, dict]]:
    """Each run's (seed, condition): clip with seeds 0..R-1, or the study's conditions x
    seeds."""
    if args.study:
        return [(s, c) for c in STUDY for s in range(args.runs)]
    return [(s, {"objective": "clip"}) for s in range(args.runs)]


def measure(args: argparse.Namespace) -> tuple[dict[str, tuple[float, float, int]], bool]:
    """Per side: (wall s, loop s, env steps) of all runs; whether every run's metrics are the
    same in both."""
    out = {}
    runs = plan(args)
    with tempfile.TemporaryDirectory() as d:
        roots = {e: os.path.join(d, e) for e in ("baseline", "group")}
        common = dict(cpu=args.cpu, preset=args.preset, steps=args.steps,
                      backend=args.env_backend, plan=runs)
        wall = loop = steps = 0.0
        for i in range(len(runs)):
            w, (s, el) = run(ALONE.format(root=roots["baseline"], seed=i, **common),
                             args.baseline)
            wall, loop, steps = wall + w, loop + float(el), steps + int(s)
        out["baseline"] = (wall, loop, int(steps))
        w, (s, el) = run(GROUP.format(root=roots["group"], runs=len(runs), **common))
        out["group"] = (w, float(el), int(s))
        same = all(metrics(Path(roots["baseline"]) / f"run{i}")
                   == metrics(Path(roots["group"]) / f"run{i}") for i in range(len(runs)))
    return out, same


def single(args: argparse.Namespace) -> None:
    """One run alone in both trees, three times each, interleaved: loop seconds."""
    loops: dict[str, list[float]] = {"baseline": [], "this tree": []}
    common = dict(cpu=args.cpu, preset=args.preset, steps=args.steps, backend=args.env_backend,
                  plan=[(0, {"objective": "clip"})])
    for _ in range(3):
        for side, path in (("baseline", args.baseline), ("this tree", None)):
            with tempfile.TemporaryDirectory() as d:
                _, (_, el) = run(ALONE.format(root=d, seed=0, **common), path)
                loops[side].append(float(el))
    b, t = min(loops["baseline"]), min(loops["this tree"])
    print(f"one run alone (R = 1), best of 3 loops: baseline {b:.2f} s, this tree {t:.2f} s: "
          f"{b / t:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="source root of the baseline klppo")
    ap.add_argument("--preset", default="klip/hopper")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=8192, help="env steps per run")
    ap.add_argument("--cpu", type=int, default=0, help="the one core every process runs on")
    ap.add_argument("--env-backend", choices=["gymnasium", "envpool"], default="gymnasium")
    ap.add_argument("--single", action="store_true", help="also time one run alone")
    ap.add_argument("--study", action="store_true",
                    help="the four-condition study (--runs seeds each) instead of clip runs")
    args = ap.parse_args()
    what = (f"the four-condition study x {args.runs} seeds" if args.study else
            f"{args.runs} runs (clip, seeds 0..{args.runs - 1})")
    print(f"{args.preset} on {args.env_backend}: {what} x {args.steps} steps, every process on "
          f"cpu {args.cpu}, one thread")
    _, (bare,) = run(BARE.format(cpu=args.cpu, preset=args.preset, backend=args.env_backend))
    res, same = measure(args)
    print(f"{'side':<10} {'wall s':>8} {'loop s':>8} {'steps/s wall':>13} {'steps/s loop':>13} "
          f"{'us/run-step above the bare step':>32}")
    rate = {}
    for side in ("baseline", "group"):
        wall, loop, steps = res[side]
        rate[side] = (steps / wall, steps / loop)
        print(f"{side:<10} {wall:8.1f} {loop:8.1f} {rate[side][0]:13.0f} {rate[side][1]:13.0f} "
              f"{loop / steps * 1e6 - float(bare):32.1f}")
    print(f"ratio group/baseline (summed env-steps/s): "
          f"{rate['group'][0] / rate['baseline'][0]:.2f}x wall (imports included), "
          f"{rate['group'][1] / rate['baseline'][1]:.2f}x training loop; bare env step "
          f"{float(bare):.1f} us; same metrics per run: {'yes' if same else 'NO'}")
    if args.single:
        single(args)


if __name__ == "__main__":
    main()
