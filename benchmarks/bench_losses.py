"""Forward + backward time of each PPO objective on one minibatch (default 4096 samples).

Usage: python benchmarks/bench_losses.py [--n 4096] [--repeats 2000] [--threads 1]

Each objective is timed as ``-objective(...).mean()`` plus ``backward()`` on a fresh leaf, the
timings interleaved round-robin (so machine noise hits every objective alike) and summarised by
the median of 20 blocks. The ratio column is relative to the clip objective.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from klppo.core import surrogates as S
from klppo.core.kl import sampled_kl


def objectives(lo, a, kl):
    return {
        "clip": lambda x: S.clip_objective(torch.exp(x - lo), a),
        "per_sample_kl[clip]": lambda x: S.per_sample_kl_objective(x, lo, a),
        "per_sample_kl[linear_ramp]": lambda x: S.per_sample_kl_objective(
            x, lo, a, shape="linear_ramp", softness=0.1),
        "per_sample_kl[sigmoid]": lambda x: S.per_sample_kl_objective(
            x, lo, a, shape="sigmoid", softness=0.1),
        "per_sample_kl[soft_min]": lambda x: S.per_sample_kl_objective(
            x, lo, a, shape="soft_min", softness=0.1),
        "per_sample_kl[spo]": lambda x: S.per_sample_kl_objective(x, lo, a, shape="spo"),
        "unclipped": lambda x: S.unclipped_objective(torch.exp(x - lo), a),
        "kl_penalty[k3]": lambda x: S.kl_penalty_objective(
            torch.exp(x - lo), a, sampled_kl(lo, x, "k3"), 0.5),
        "kl_penalty[analytic]": lambda x: S.kl_penalty_objective(torch.exp(x - lo), a, kl, 0.5),
        "dual_clip": lambda x: S.clip_objective(torch.exp(x - lo), a, dual_clip=3.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    lo = -torch.rand(args.n, generator=g) - 0.1
    lp = lo + 0.3 * torch.randn(args.n, generator=g)
    a = torch.randn(args.n, generator=g)
    kl_base = torch.rand(args.n, generator=g)
    objs = objectives(lo, a, kl_base)
    blocks = 20
    per_block = max(1, args.repeats // blocks)
    times: dict[str, list[float]] = {k: [] for k in objs}
    for _ in range(3):  # warm-up
        for fn in objs.values():
            x = lp.clone().requires_grad_(True)
            (-fn(x).mean()).backward()
    for _ in range(blocks):
        for name, fn in objs.items():
            t0 = time.perf_counter()
            for _ in range(per_block):
                x = lp.clone().requires_grad_(True)
                (-fn(x).mean()).backward()
            times[name].append((time.perf_counter() - t0) / per_block)
    base = statistics.median(times["clip"])
    print(f"forward+backward, n={args.n}, torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{'objective':<28} {'median us':>10} {'vs clip':>8}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<28} {med * 1e6:>10.1f} {med / base:>8.2f}x")


if __name__ == "__main__":
    main()
