"""Aggregate statistics: the KLip-PPO table (mean, population std) and IQM with a stratified
bootstrap 95% confidence interval (Agarwal et al. 2021; defined in :mod:`klppo.report.aggregate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from klppo.report import aggregate as A

__all__ = ["Summary", "iqm", "bootstrap_iqm_ci", "mean_std", "summarize", "curve_on_grid"]


def iqm(x: np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% (scipy's trim_mean with 0.25)."""
    return A.iqm(np.asarray(x, float))


def bootstrap_iqm_ci(x: np.ndarray, reps: int = A.REPS, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the IQM, resampling seeds with replacement (one task: the
    stratified bootstrap of :func:`klppo.report.aggregate.bootstrap_ci` over seeds)."""
    return A.bootstrap_ci(np.asarray(x, float), reps, seed, level)


def mean_std(x: np.ndarray) -> tuple[float, float]:
    """Mean and population std; returns near the float limit (a run logs +-inf as +-1e308)
    are scaled first, so they give finite numbers rather than ``inf ± nan``."""
    x, s = A.scaled(np.asarray(x, float))
    return float(x.mean()) * s, float(x.std(ddof=0)) * s


@dataclass
class Summary:
    env: str
    condition: str
    n: int
    mean: float
    std: float  # population std over seeds (ddof 0), as in the KLip-PPO tables
    iqm: float
    ci_low: float
    ci_high: float
    per_seed: dict[int, float]
    policy: str | None = None
    """a multi-agent run's policy (one row per condition and policy); None: single-agent"""


def summarize(env: str, condition: str, per_seed: dict[int, float],
              policy: str | None = None) -> Summary:
    vals = np.array([v for v in per_seed.values() if not math.isnan(v)], float)
    if len(vals) == 0:
        return Summary(env, condition, 0, math.nan, math.nan, math.nan, math.nan, math.nan,
                       per_seed, policy)
    lo, hi = bootstrap_iqm_ci(vals)
    mean, std = mean_std(vals)
    return Summary(env, condition, len(vals), mean, std, iqm(vals), lo, hi, per_seed, policy)


def curve_on_grid(steps: list[float], values: list[float | None],
                  grid: np.ndarray) -> np.ndarray:
    """A run's curve (NaN before its first value) carried forward onto a common step grid."""
    s = np.asarray(steps, float)
    v = np.array([np.nan if x is None else x for x in values], float)
    ok = ~np.isnan(v)
    if not ok.any():
        return np.full(len(grid), np.nan)
    s, v = s[ok], v[ok]
    idx = np.searchsorted(s, grid, side="right") - 1
    return np.where(idx >= 0, v[np.clip(idx, 0, None)], np.nan)
