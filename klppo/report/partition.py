"""The kill set in numbers: peak kill fraction and the |beta_t| quantiles per env and condition.

On the samples the clip kills, PPO-Clip's gradient is a KL penalty with the per-sample
coefficient beta_t = -w_t A_t (KLip-PPO, Theorem 1); elsewhere beta_t is 0. The table says how
large that set got (``frac_kill``, the peak over training of its mean over seeds) and how large
the coefficient was on it at the end: the mean |beta_t| on the kill set (:func:`kill_set_beta`)
and ``beta_t_q50/q90/q99``, the quantiles of |beta_t| over *all* samples, each averaged over the
last 10% of environment steps, then mean ± std over seeds. Those quantiles are 0 while fewer
than 50% (q50) or 10% (q90) of the samples are killed, which is most of training: the kill-set
mean is the number to read.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from klppo.report.grid import shown
from klppo.report.load import Run

__all__ = ["partition_table", "kill_set_beta"]

QUANTILES = ("beta_t_q50", "beta_t_q90", "beta_t_q99")

#: objectives whose beta_t is the clip shape's: -w A on the kill set, 0 elsewhere
_CLIP_SHAPED = frozenset({"clip", "clip_kl", "per_sample_kl"})


def kill_set_beta(m: dict[str, Any], config: dict[str, Any]) -> float | None:
    """Mean |beta_t| over the kill set of one iteration: ``beta_t_abs_mean / frac_kill`` (both
    over all the iteration's samples, and beta_t is 0 off the kill set for the clip shape).
    None where it cannot be derived: a metric missing, no sample killed, an objective whose
    beta_t is not the clip shape's (the catalogue's: cispo, sapo, ..., whose beta_t is not 0
    off the kill set), or a per_sample_kl shape other than clip."""
    if config.get("objective", "clip") not in _CLIP_SHAPED:
        return None
    if (config.get("ppo") or {}).get("shape", "clip") != "clip":
        return None
    a, f = m.get("beta_t_abs_mean"), m.get("frac_kill")
    if not isinstance(a, (int, float)) or not isinstance(f, (int, float)) or f <= 0:
        return None
    return float(a) / float(f)


def _peak_kill(runs: list[Run]) -> tuple[float, int]:
    """Max over iterations of the seed-mean kill fraction, and its environment step."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        for m in r.metrics:
            if isinstance(m.get("frac_kill"), float):
                by_step[int(m["global_step"])].append(m["frac_kill"])
    means = {s: statistics.mean(v) for s, v in by_step.items() if len(v) == len(runs)}
    step = max(means, key=lambda s: means[s])
    return means[step], step


def _final(run: Run, key: str, fraction: float = 0.1) -> float | None:
    last = max(int(m["global_step"]) for m in run.metrics)
    value = (lambda m: kill_set_beta(m, run.config)) if key == "kill_set" else (
        lambda m: m.get(key) if isinstance(m.get(key), float) else None)
    vals = [v for m in run.metrics if int(m["global_step"]) > last * (1 - fraction)
            and (v := value(m)) is not None]
    return statistics.mean(vals) if vals else None


def _mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3g} ± {statistics.pstdev(xs):.2g}"


def partition_table(runs: list[Run]) -> str:
    """A markdown table, one row per (env, condition) whose runs log a kill fraction."""
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        if r.metrics and "frac_kill" in r.metrics[0] and "beta_t_q90" in r.metrics[0]:
            groups[(r.env, r.condition)].append(r)
    lines = ["| env | condition | seeds | peak kill fraction (at env step) | final mean "
             "abs(beta_t) on the kill set | final abs(beta_t) over all samples: q50 | q90 | "
             "q99 |", "|---|---|---|---|---|---|---|---|"]
    for (env, cond), rs in sorted(groups.items()):
        peak, step = _peak_kill(rs)
        qs = []
        for key in ("kill_set", *QUANTILES):
            vals = [v for v in (_final(r, key) for r in rs) if v is not None]
            qs.append(_mean_std(vals) if vals else "-")
        lines.append(f"| {env} | {shown(cond)} | {len(rs)} | {peak:.3f} ({step:,}) | "
                     + " | ".join(qs) + " |")
    return "\n".join(lines)
