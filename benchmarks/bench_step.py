"""A/B timing of two versions of the numpy minibatch step, interleaved in one process.

Usage:
    mkdir /tmp/old && git archive <rev> klppo | tar -x -C /tmp/old
    python benchmarks/bench_step.py /tmp/old . [--n 2048]

Each argument is a source root holding a ``klppo`` package; both are imported side by side (the
numpy step is a one-row ``klppo.rl.engine.numpy_stack.NumpyStack``, ``klppo.nn.numpy.NumpyStep``
before #29, or ``klppo.nn.fastpath.FastStep`` before #20) and
step identical copies of a 2x64 tanh actor-critic
(CartPole sizes, clip objective, value clip 0.2) on the same minibatch, in alternating blocks, so
the machine's drift hits both alike. Prints each version's median and best time per step, the
median of the per-block ratios, and whether both ended with bit-identical parameters.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import numpy as np
import torch


def load(root: str):
    """``(step(batch), flat weights)`` of a fresh 2x64 CartPole actor-critic, from the klppo
    package under ``root`` (imported apart from any other klppo already loaded)."""
    for k in [k for k in sys.modules if k == "klppo" or k.startswith("klppo.")]:
        del sys.modules[k]
    sys.path.insert(0, root)
    try:
        loss = importlib.import_module("klppo.core.loss").PPOLoss("clip", value_clip=0.2)
        nn = importlib.import_module("klppo.nn")
        torch.manual_seed(0)
        agent = nn.ActorCritic(4, nn.CategoricalHead(2))
        try:
            return _stack_of_one(agent, loss)
        except ModuleNotFoundError:
            pass
        try:
            step = importlib.import_module("klppo.nn.numpy").NumpyStep(agent, loss, 3e-4, 1e-5,
                                                                       0.5)
            return (lambda b: step.step_arrays(*b, 0.0)), step.weights.flat
        except (ModuleNotFoundError, AttributeError):
            fp = importlib.import_module("klppo.nn.fastpath")
            old = fp.FastStep(agent, loss, 3e-4, 1e-5, 0.5, *fp.flatten_parameters(agent))
            return (lambda b: old.step(*b, 0.0, False, False)), old.flat
    finally:
        sys.path.remove(root)


def _stack_of_one(agent, loss):
    """The engine's numpy stack with one row (since #29): its step on a minibatch."""
    ns = importlib.import_module("klppo.rl.engine.numpy_stack")
    rows = importlib.import_module("klppo.rl.engine.rows")
    mlp = importlib.import_module("klppo.nn.numpy.mlp")
    ppo = importlib.import_module("klppo.rl.config").PPOConfig(lr=3e-4, adam_eps=1e-5,
                                                               max_grad_norm=0.5)
    stack = ns.NumpyStack(1)
    stack.maker(0, ppo)(agent, loss)
    ws, row = mlp.Workspace(), np.array([0])

    def step(b):
        n = len(b[0])
        mb = rows.Minibatch(np.arange(n)[None], *(np.asarray(x)[None] for x in b))
        return stack.step(row, mb, [loss], [0.0], ws)
    return step, stack.W[0]


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
    loaded = [load(args.a), load(args.b)]
    calls = [lambda f=f: f(batch) for f, _ in loaded]
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
    print("bit-identical parameters afterwards:", np.array_equal(loaded[0][1], loaded[1][1]))


if __name__ == "__main__":
    main()
