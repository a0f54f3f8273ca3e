"""The engine's torch stack on a device against its numpy stack on the CPU: where time goes.

Usage: python benchmarks/bench_engine_device.py --device cuda [--runs 20 100] [--steps 4096]
                                                [--preset klip/hopper] [--stacks numpy torch]

For each R in ``--runs``, trains R runs (the preset, seeds 0..R-1, objective clip) in one process
twice, each in a fresh process with one CPU thread: the numpy stack (the fast path, on the CPU) and
the torch stack on ``--device`` (``fast_path: false``), in the order ``--stacks`` names them
(``torch numpy`` first measures the device where a time limit may stop the second). Each phase of
the training loop is timed by wrapping the engine's own functions (the device synchronised after
each call): the stacked policy forward of the rollout, the runs' action sampling, the env steps
with the checks, bookkeeping, normalisation and buffer writes, the minibatch steps, the rollout
KLs; "other" is the rest of the loop (advantages, diagnostics, controllers, metrics and
checkpoints). Prints per stack the loop's summed env-steps per second and the seconds in each
phase. Needs the env's extra (mujoco for klip/hopper); ``--device cpu`` runs the torch stack on the
CPU (e.g. to try the script).
"""

from __future__ import annotations

import argparse
import json
import tempfile

from _proc import run

CHILD = """
import collections, dataclasses, json, logging, time
import torch
import klppo.rl as rl
from klppo.rl.engine.collect import StackedRollout
from klppo.rl.engine.numpy_stack import NumpyStack
from klppo.rl.engine.torch_stack import TorchStack
logging.disable(logging.WARNING)
device, fast = {device!r}, {fast!r}
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
spent = collections.Counter()

def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        sync()
        spent[name] += time.perf_counter() - t
        return out
    return wrapper

for cls in (NumpyStack, TorchStack):
    cls.act = timed("forward", cls.act)
    cls.step = timed("minibatch_steps", cls.step)
    cls.policy_kl = timed("rollout_kl", cls.policy_kl)
StackedRollout._act = timed("sampling", StackedRollout._act)
StackedRollout._step = timed("env_step", StackedRollout._step)

def cfg(seed):
    c = rl.preset({preset!r})
    return dataclasses.replace(c, seed=seed, objective="clip", total_steps={steps},
                               tensorboard=False, fast_path=fast, device=device,
                               out=f"{root}/run{{seed}}")
res = rl.train_batched([cfg(s) for s in range({runs})])
assert all(r.status == "finished" for r in res), [r.status for r in res]
loop = max(r.metrics[-1]["time_elapsed"] for r in res)
steps = sum(r.metrics[-1]["global_step"] for r in res)
print("RESULT", json.dumps({{"loop": loop, "steps": steps, **spent}}).replace(" ", ""))
"""

PHASES = ("forward", "sampling", "env_step", "minibatch_steps", "rollout_kl")
LABELS = ("forward (rollout)", "sampling + buffer", "env step + per-run work", "minibatch steps",
          "rollout KL")


def measure(preset: str, runs: int, steps: int, device: str, fast: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        _, fields = run(CHILD.format(preset=preset, runs=runs, steps=steps, device=device,
                                     fast=fast, root=root))
    return json.loads(fields[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, nargs="+", default=[20, 100])
    ap.add_argument("--steps", type=int, default=4096, help="env steps per run")
    ap.add_argument("--preset", default="klip/hopper")
    ap.add_argument("--stacks", nargs="+", choices=("numpy", "torch"), default=["numpy", "torch"])
    args = ap.parse_args()
    stacks = {"numpy": ("numpy cpu", "cpu", True),
              "torch": (f"torch {args.device}", args.device, False)}
    print(f"{args.preset}: R runs x {args.steps} steps (clip), one process per stack, one CPU "
          f"thread; seconds of the training loop")
    head = ["R", "stack", "steps/s", "loop s", *LABELS, "other"]
    print(" | ".join(head))
    for R in args.runs:
        for name, device, fast in (stacks[s] for s in args.stacks):
            r = measure(args.preset, R, args.steps, device, fast)
            other = r["loop"] - sum(r.get(p, 0.0) for p in PHASES)
            cells = [str(R), name, f"{r['steps'] / r['loop']:.0f}", f"{r['loop']:.1f}",
                     *(f"{r.get(p, 0.0):.1f}" for p in PHASES), f"{other:.1f}"]
            print(" | ".join(cells))


if __name__ == "__main__":
    main()
