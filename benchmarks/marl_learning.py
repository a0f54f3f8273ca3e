"""Did each policy of a multi-agent sweep learn? Trained policies against random opponents.

    python benchmarks/marl_learning.py SWEEP_DIR DEST.md [--episodes 200]

For every finished run of the sweep (e.g. ``klppo sweep --spec
examples/marl_simple_adversary.yaml``) and every policy P, P's mean episode return (mean over its
agents) when P is trained and every other policy acts uniformly at random, against the same
with P random too (both on the same episode seeds). The gain is what training bought P against
an opponent that did not learn. Also: each policy's final training return (last 10% of steps)
and the returns with every policy trained. Writes a markdown table with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from klppo.report.load import describe_machine
from klppo.report.snapshot import FLOAT_NOTE
from klppo.rl.marl.evaluate import evaluate_policies
from klppo.runs.metrics import read_metrics
from klppo.runs.protocol import final_return


def _runs(sweep: Path) -> list[Path]:
    runs = sorted(p for p in (sweep / "runs").iterdir() if (p / "checkpoint.pt").exists())
    return [r for r in runs if json.loads((r / "status.json").read_text())["state"] == "finished"]


def _metadata(run: Path) -> dict:
    return json.loads((run / "metadata.json").read_text())


def _condition_seed(run: Path) -> tuple[str, int]:
    parts = run.name.split("__")
    return parts[-2], int(parts[-1])


def measure(run: Path, episodes: int) -> dict[str, dict[str, float]]:
    both = evaluate_policies(run, episodes)
    policies = list(both)
    everyone = evaluate_policies(run, episodes, random=policies)
    records, _ = read_metrics(run / "metrics.jsonl")
    out = {}
    for p in policies:
        alone = evaluate_policies(run, episodes, random=[q for q in policies if q != p])
        out[p] = {"trained_vs_random": alone[p].mean, "random_vs_random": everyone[p].mean,
                  "all_trained": both[p].mean, "final_training": final_return(records, policy=p)}
    return out


def _mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.2f} ± {statistics.pstdev(xs):.2f}"


def table(results: dict[Path, dict[str, dict[str, float]]], episodes: int) -> list[str]:
    lines = ["| condition | seed | policy | trained vs random | random vs random | gain | "
             "all trained | final training return |", "|---|---|---|---|---|---|---|---|"]
    gains: dict[tuple[str, str], list[float]] = {}
    for run, per in results.items():
        cond, seed = _condition_seed(run)
        for p, m in per.items():
            gain = m["trained_vs_random"] - m["random_vs_random"]
            gains.setdefault((cond, p), []).append(gain)
            lines.append(f"| {cond} | {seed} | {p} | {m['trained_vs_random']:.2f} | "
                         f"{m['random_vs_random']:.2f} | {gain:+.2f} | {m['all_trained']:.2f} | "
                         f"{m['final_training']:.2f} |")
    lines += ["", f"Gain over seeds (mean ± std over seeds; each value a mean of {episodes} "
              "episodes):", "", "| condition | policy | seeds | gain |", "|---|---|---|---|"]
    for (cond, p), g in sorted(gains.items()):
        lines.append(f"| {cond} | {p} | {len(g)} | {_mean_std(g)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("dest")
    ap.add_argument("--episodes", type=int, default=200)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # one small network per step: more threads only contend
    sweep = Path(args.sweep)
    results = {run: measure(run, args.episodes) for run in _runs(sweep)}
    if not results:
        print(f"{sweep}: no finished runs", file=sys.stderr)
        return 2
    spec = (sweep / "spec.yaml").read_text() if (sweep / "spec.yaml").exists() else ""
    lines = ["# Multi-agent PPO on MPE simple_adversary: trained policies vs random opponents", "",
             f"Measured on: {describe_machine(_metadata(next(iter(results))))}.", "",
             f"Command: `klppo sweep --spec examples/marl_simple_adversary.yaml --out {sweep}` "
             f"then `python benchmarks/marl_learning.py {sweep} {args.dest} --episodes "
             f"{args.episodes}`.", "", FLOAT_NOTE, "",
             "Returns are per episode (25 steps), the mean over the policy's agents, sampled "
             "actions, episode seeds 1000000 onwards. *trained vs random*: this policy trained, "
             "every other one uniformly random; *random vs random*: all random on the same seeds; "
             "*all trained*: the run's policies against each other.", "",
             *table(results, args.episodes), "", "The sweep spec:", "", "```yaml", spec.strip(),
             "```", ""]
    Path(args.dest).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
