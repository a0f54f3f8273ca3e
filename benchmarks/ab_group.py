"""Interleaved A/B of two klppo checkouts on one group of R runs: the training loop's time
per run-step (the runs' ``time_elapsed``) and the process's CPU time, the other checkout first,
then this one, ``--pairs`` times, so that the machine's drift hits both alike.

Usage:
    git worktree add /tmp/old <rev>
    python benchmarks/ab_group.py /tmp/old [--preset klip/cartpole] [--runs 20]
        [--steps 30720] [--pairs 3] [--cpu 0] [--target-kl X] [--no-fast-path]

``--target-kl X`` gives every run SB3's minibatch early stop at ``X`` (nats per sample);
``--no-fast-path`` trains the group on the torch stack.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: one group in a fresh process; prints "loop_s cpu_s"
CHILD = r"""
import dataclasses, logging, os, sys, tempfile, time
os.sched_setaffinity(0, {int(sys.argv[4])})
import klppo.rl as rl
logging.disable(logging.WARNING)
preset, R, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ppo = rl.preset(preset).ppo
if sys.argv[5] != "none":
    ppo = dataclasses.replace(ppo, target_kl=float(sys.argv[5]), early_stop="minibatch")
with tempfile.TemporaryDirectory() as root:
    cfgs = [dataclasses.replace(rl.preset(preset), seed=s, objective="clip", total_steps=steps,
                                tensorboard=False, out=os.path.join(root, f"r{s}"), ppo=ppo,
                                fast_path=sys.argv[6] != "torch")
            for s in range(R)]
    c0 = time.process_time()
    rs = rl.train_batched(cfgs)
    cpu = time.process_time() - c0
print(max(r.metrics[-1]["time_elapsed"] for r in rs), cpu)
"""


def one(tree: Path, a: argparse.Namespace) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, a.preset, str(a.runs), str(a.steps),
                          str(a.cpu), "none" if a.target_kl is None else str(a.target_kl),
                          "torch" if a.no_fast_path else "numpy"],
                         env=env, cwd=tree, capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", type=Path, help="the other checkout (a git worktree)")
    ap.add_argument("--preset", default="klip/cartpole")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=30720)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--target-kl", type=float, default=None,
                    help="SB3's minibatch early stop at this k3 target for every run")
    ap.add_argument("--no-fast-path", action="store_true", help="the torch stack")
    a = ap.parse_args()
    per = 1e6 / (a.runs * a.steps)
    stop = "" if a.target_kl is None else f", early stop at k3 > 1.5 x {a.target_kl}"
    stop += ", torch stack" if a.no_fast_path else ""
    print(f"{a.preset}: {a.runs} runs x {a.steps} steps in one group{stop}, cpu {a.cpu}; "
          f"us per run-step of loop (CPU s)")
    for i in range(1, a.pairs + 1):
        (lo, co), (ln, cn) = one(a.other.resolve(), a), one(HERE, a)
        print(f"pair {i}: other {lo * per:.2f} ({co:.1f} s), this {ln * per:.2f} ({cn:.1f} s)")


if __name__ == "__main__":
    main()
