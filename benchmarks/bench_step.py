"""A/B timing of two versions of the fast-path minibatch step, interleaved in one process.

Usage:
    git show <rev>:klppo/nn/fastpath.py > /tmp/fastpath_old.py
    python benchmarks/bench_step.py /tmp/fastpath_old.py klppo/nn/fastpath.py [--n 2048]

Both files are loaded as modules and step identical copies of a 2x64 tanh actor-critic
(CartPole sizes, clip objective, value clip 0.2) on the same minibatch, in alternating blocks, so
the machine's drift hits both alike. Prints each version's median and best time per step, the
median of the per-block ratios, and whether both ended with bit-identical parameters.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np
import torch

from klppo.core.loss import PPOLoss
from klppo.nn import ActorCritic, CategoricalHead


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--n", type=int, default=2048, help="minibatch size")
    ap.add_argument("--blocks", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = args.n
    batch = (rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 2, n),
             rng.standard_normal((n, 2)).astype(np.float32), np.full(n, -0.69, np.float32),
             rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
             rng.standard_normal(n).astype(np.float32))
    steps = []
    for path, name in ((args.a, "fast_a"), (args.b, "fast_b")):
        mod = load(path, name)
        torch.manual_seed(0)
        agent = ActorCritic(4, CategoricalHead(2))
        step = mod.FastStep(agent, PPOLoss("clip", value_clip=0.2), 3e-4, 1e-5, 0.5,
                            *mod.flatten_parameters(agent))
        steps.append(step)
    calls = [lambda s=s: s.step(*batch, 0.0, False, False) for s in steps]
    for _ in range(20):
        for f in calls:
            f()
    times = [[], []]
    for _ in range(args.blocks):
        for k, f in enumerate(calls):
            t = time.perf_counter()
            for _ in range(20):
                f()
            times[k].append((time.perf_counter() - t) / 20 * 1e6)
    ta, tb = np.array(times[0]), np.array(times[1])
    print(f"n={n}: A median {np.median(ta):.0f} us (best {ta.min():.0f}) | "
          f"B median {np.median(tb):.0f} us (best {tb.min():.0f}) | "
          f"B/A median of block ratios {np.median(tb / ta):.3f}")
    print("bit-identical parameters afterwards:", np.array_equal(steps[0].flat, steps[1].flat))


if __name__ == "__main__":
    main()
