"""rliable-style aggregates (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
Precipice"): the interquartile mean with a stratified bootstrap confidence interval, performance
profiles (score distributions) and the probability of improvement.

Scores are matrices of shape ``(runs, tasks)``: ``scores[n, m]`` is run (seed) ``n`` on task
``m`` (a 1-d array is one task). The definitions are rliable 1.2's (``rliable.metrics`` and
``rliable.library``), written with numpy and scipy:

* IQM: ``scipy.stats.trim_mean(scores, 0.25, axis=None)``, the mean of the middle 50% of all
  scores (below 4 seeds nothing is trimmed: the IQM is the mean; :func:`iqm_note` says so);
* stratified bootstrap: each replicate draws, for each task separately, as many runs as it
  has, with replacement; a percentile interval over the replicates;
* score distribution at ``tau``: the share of runs (averaged over tasks) whose score is above
  ``tau``; its band is the stratified bootstrap's percentile interval at every ``tau``;
* probability of improvement ``P(X > Y)``: for each task, the Mann-Whitney U statistic of X's
  runs against Y's (ties count 1/2) divided by ``n_x * n_y``, averaged over tasks; its interval
  resamples X and Y independently within each task.

Why not the rliable package itself: rliable 1.2.0 installs with klppo's constraints, but its
bootstrap module imports ``arch``, and the arch (7.2) that the resolver picks next to pandas 3.1
fails at import (``deprecate_kwarg() missing 1 required positional argument``); it would also
bring pandas, statsmodels, arch and seaborn into a report that reads JSON files. The tests check
these functions against ``rliable.metrics`` where it is installed and against slow loops.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy import stats as sps

__all__ = ["as_matrix", "scaled", "iqm", "iqm_note", "TRIM", "stratified_indices", "bootstrap_ci",
           "score_distribution", "performance_profile", "probability_of_improvement",
           "improvement_ci", "REPS"]

#: bootstrap replicates (rliable's profile default; its interval default is 50,000)
REPS = 2000
#: the share of scores the IQM leaves out at each end
TRIM = 0.25


def as_matrix(scores) -> np.ndarray:
    """``scores`` as a float ``(runs, tasks)`` matrix (a 1-d array is one task)."""
    x = np.asarray(scores, float)
    return x[:, None] if x.ndim == 1 else x


def scaled(x: np.ndarray) -> tuple[np.ndarray, float]:
    """``x / s`` and ``s``: returns near the float limit (a run logs +-inf as +-1e308) are
    averaged without overflowing to inf (and a spread of nan)."""
    big = float(np.max(np.abs(x))) if x.size else 0.0
    return (x / big, big) if big > 1e300 else (x, 1.0)


def iqm(scores) -> float:
    """Interquartile mean over all runs and tasks (rliable's ``aggregate_iqm``)."""
    x, s = scaled(as_matrix(scores))
    return float(sps.trim_mean(x, TRIM, axis=None)) * s


def stratified_indices(n_runs: int, n_tasks: int, reps: int,
                       rng: np.random.Generator) -> np.ndarray:
    """``(reps, n_runs, n_tasks)`` run indices: each task's runs drawn with replacement from
    that task's own runs (one task: the plain bootstrap over seeds)."""
    return rng.integers(0, n_runs, size=(reps, n_runs, n_tasks))


def _replicates(x: np.ndarray, reps: int, seed: int) -> np.ndarray:
    """``(reps, runs * tasks)``: the stratified bootstrap samples, flattened per replicate."""
    rng = np.random.default_rng(seed)
    idx = stratified_indices(x.shape[0], x.shape[1], reps, rng)
    return x[idx, np.arange(x.shape[1])].reshape(reps, -1)


def bootstrap_ci(scores, reps: int = REPS, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the IQM under the stratified bootstrap."""
    x, s = scaled(as_matrix(scores))
    if x.size == 0:
        return math.nan, math.nan
    values = sps.trim_mean(_replicates(x, reps, seed), TRIM, axis=1)
    lo, hi = np.percentile(values, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo) * s, float(hi) * s


def score_distribution(scores, taus) -> np.ndarray:
    """The share of runs with a score above each ``tau``, averaged over tasks."""
    x = as_matrix(scores)
    return (x[None, :, :] > np.asarray(taus, float)[:, None, None]).mean(axis=(1, 2))


def performance_profile(scores, taus, reps: int = REPS, seed: int = 0,
                        level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(profile, low, high)`` at each ``tau``: :func:`score_distribution` and its stratified
    bootstrap percentile band."""
    x = as_matrix(scores)
    t = np.asarray(taus, float)
    samples = _replicates(x, reps, seed)  # each replicate keeps the (runs, tasks) shape
    boot = (samples.reshape(reps, *x.shape)[:, None] > t[None, :, None, None]).mean(axis=(2, 3))
    lo, hi = np.percentile(boot, [100 * (1 - level) / 2, 100 * (1 + level) / 2], axis=0)
    return score_distribution(x, t), lo, hi


def _u_share(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + P(X = Y) / 2 for runs along the second-to-last axes of ``x`` (..., n) and
    ``y`` (..., m): the Mann-Whitney U of x over ``n * m``."""
    gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def probability_of_improvement(scores_x, scores_y) -> float:
    """``P(X > Y)`` averaged over tasks (rliable's ``probability_of_improvement``)."""
    x, y = as_matrix(scores_x), as_matrix(scores_y)
    return float(np.mean(_u_share(x.T, y.T)))


def improvement_ci(scores_x, scores_y, reps: int = REPS, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of :func:`probability_of_improvement`, X and Y resampled
    independently within each task."""
    x, y = as_matrix(scores_x), as_matrix(scores_y)
    rng = np.random.default_rng(seed)
    xi = stratified_indices(x.shape[0], x.shape[1], reps, rng)
    yi = stratified_indices(y.shape[0], y.shape[1], reps, rng)
    bx = x[xi, np.arange(x.shape[1])].transpose(0, 2, 1)  # (reps, tasks, runs)
    by = y[yi, np.arange(y.shape[1])].transpose(0, 2, 1)
    values = _u_share(bx, by).mean(axis=1)
    lo, hi = np.percentile(values, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def iqm_note(sizes: Iterable[int]) -> str:
    """One sentence on what the IQM and its interval mean for ``sizes`` (seeds per condition):
    what is trimmed (``int(TRIM * n)`` scores at each end, nothing below 4 seeds) and how
    far the bootstrap can be trusted."""
    ns = sorted(set(sizes))
    if not ns:
        return ""
    span = str(ns[0]) if len(ns) == 1 else f"{ns[0]} to {ns[-1]}"
    head = f"With {span} seed{'s' if ns != [1] else ''} per condition"
    if ns[-1] == 1:
        return f"{head} the IQM is that run's return and the intervals have no width."
    cut = sorted({int(TRIM * n) for n in ns})
    if cut == [0]:
        trim = "nothing is trimmed: the IQM is the mean"
    else:
        each = " or ".join(str(k) for k in cut)
        trim = f"the IQM leaves out the {each} lowest and highest returns of a condition"
    wide = " and the intervals are wide" if ns[0] < 10 else ""
    return f"{head} {trim}{wide}."

