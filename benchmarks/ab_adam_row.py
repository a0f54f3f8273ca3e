"""Interleaved A/B of one row's ``NumpyAdam.step`` (clip and Adam) in two klppo checkouts: a
run alone's optimizer step, on a gradient of the CartPole preset's size (``[1, 9155]``).

Usage:
    git worktree add /tmp/old <rev>
    python benchmarks/ab_adam_row.py /tmp/old [--pairs 2] [--calls 2000] [--cpu 0]

Each side runs in a fresh process pinned to ``--cpu``: 5 repetitions of ``--calls`` steps (a
gradient copy included), their median in microseconds per step; the other checkout first in
each pair.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
os.sched_setaffinity(0, {int(sys.argv[2])})
import numpy as np
from klppo.nn.numpy.adam import NumpyAdam
calls, P = int(sys.argv[3]), 9155
rng = np.random.default_rng(0)
adam = NumpyAdam(rng.standard_normal((1, P), dtype=np.float32), np.array([3e-4]),
                 np.array([1e-5]), np.array([0.5]))
g = rng.standard_normal((1, P), dtype=np.float32)
times = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(calls):
        adam.step(g.copy())
    times.append((time.perf_counter() - t) / calls * 1e6)
print(f"{statistics.median(times):.1f}")
"""


def median_us(tree: Path, cpu: int, calls: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(cpu), str(calls)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other", type=Path, help="the other checkout (a git worktree)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()
    print(f"one row's NumpyAdam.step, [1, 9155], cpu {args.cpu}; median us per step")
    for k in range(args.pairs):
        other = median_us(args.other, args.cpu, args.calls)
        this = median_us(HERE, args.cpu, args.calls)
        print(f"pair {k + 1}: other {other:.1f}, this {this:.1f}")


if __name__ == "__main__":
    main()
