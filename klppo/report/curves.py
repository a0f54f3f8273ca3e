"""Learning curves: one panel per grid point, one colour per base condition, and curves that are
bit-identical (clip and per_sample_kl: KLip-PPO's Theorem 1) drawn so both stay visible.

Identical curves are found from the data: two conditions of a panel whose runs have the same
seeds and exactly the same ``(global_step, episode_return_mean)`` records. The later one is drawn
dashed with markers over the earlier one's wider solid line, and its legend entry says
"identical to" the earlier one.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from klppo.report.colours import condition_colours  # noqa: E402
from klppo.report.grid import base_condition, grid_point, point_label  # noqa: E402
from klppo.report.load import Run  # noqa: E402
from klppo.report.stats import curve_on_grid  # noqa: E402

__all__ = ["learning_curves", "identical_to", "auto_smooth", "smooth_values", "window_text",
           "IDENTICAL_STYLE"]

#: how the second of two identical curves is drawn (over the first's wide solid line)
IDENTICAL_STYLE: dict[str, Any] = {"ls": (0, (4, 3)), "lw": 1.4, "marker": "o", "ms": 3.5,
                                   "markevery": 16, "zorder": 4}


def _f(x) -> float:
    return np.nan if x is None else float(x)


def smooth_values(values, k: int) -> np.ndarray:
    """Trailing moving average over ``k`` points (NaNs skipped; all-NaN windows stay NaN)."""
    v = np.array([_f(x) for x in values], float)
    if k <= 1 or len(v) == 0:
        return v
    ok = ~np.isnan(v)
    csum = np.concatenate([[0.0], np.cumsum(np.where(ok, v, 0.0))])
    cnt = np.concatenate([[0], np.cumsum(ok)])
    hi = np.arange(1, len(v) + 1)
    lo = np.maximum(0, hi - k)
    n = cnt[hi] - cnt[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (csum[hi] - csum[lo]) / np.maximum(n, 1), np.nan)


def auto_smooth(runs: list[Run]) -> int:
    """The default window: about 5% of the longest run's iterations, 1 to 50 (a 100-iteration
    run is averaged over 5 iterations; fewer than 30 iterations are drawn raw)."""
    n = max((len(r.metrics) for r in runs), default=0)
    return max(1, min(50, int(math.floor(n / 20 + 0.5))))


def window_text(smooth: int) -> str:
    """What the curves of a figure are, for its title and caption."""
    if smooth <= 1:
        return "raw, not smoothed"
    return f"trailing moving average over {smooth} iterations"


def _signature(runs: list[Run]) -> tuple:
    return tuple(sorted((r.seed, tuple((m["global_step"], m.get("episode_return_mean"))
                                       for m in r.metrics)) for r in runs))


def identical_to(by_cond: dict[str, list[Run]]) -> dict[str, str]:
    """``{condition: earlier condition}`` for each condition (in the dict's order) whose runs
    have the same seeds and bit-identical return curves as an earlier one's."""
    sig = {c: _signature(rs) for c, rs in by_cond.items()}
    out: dict[str, str] = {}
    conds = list(by_cond)
    for i, c in enumerate(conds):
        match = next((d for d in conds[:i] if d not in out and sig[d] == sig[c]), None)
        if match is not None:
            out[c] = match
    return out


def _sortable(point: tuple) -> list:
    return [(a, (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))) for a, v in point]


def _mean_band(rs: list[Run], grid: np.ndarray, smooth: int):
    curves = np.stack([curve_on_grid(
        [m["global_step"] for m in r.metrics],
        list(smooth_values([m.get("episode_return_mean") for m in r.metrics], smooth)),
        grid) for r in rs])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before episode 1
        mean = np.nanmean(curves, 0)
        n = np.sum(~np.isnan(curves), 0)
        sem = np.nanstd(curves, 0) / np.sqrt(np.maximum(n, 1))
    return mean, 1.96 * sem


def _panel(ax, by_base: dict[str, list[Run]], colour: dict[str, tuple[float, float, float]],
           grid: np.ndarray, smooth: int) -> dict[str, str]:
    """One grid point's curves; returns its identical pairs."""
    same = identical_to(by_base)
    for base, rs in by_base.items():
        mean, half = _mean_band(rs, grid, smooth)
        if base in same:
            ax.plot(grid, mean, color=colour[base], **IDENTICAL_STYLE)
            continue
        wide = base in same.values()
        ax.plot(grid, mean, color=colour[base], lw=3.2 if wide else 1.5,
                alpha=0.75 if wide else 1.0)
        ax.fill_between(grid, mean - half, mean + half, alpha=0.15, color=colour[base], lw=0)
    for base, rs in by_base.items():
        steps, values = eval_curve(rs)
        if steps:
            ax.plot(steps, values, color=colour[base], **EVAL_STYLE)
    ax.grid(alpha=0.3)
    return same


#: how the deterministic evaluations (eval_every) are drawn beside the training return
EVAL_STYLE: dict[str, Any] = {"ls": ":", "marker": "o", "ms": 3, "lw": 1.2}


def eval_curve(rs: list[Run]) -> tuple[list[int], list[float]]:
    """The mean over ``rs`` of their deterministic evaluations (``eval_return_mean``, logged
    with ``eval_every``) at the steps every one of them evaluated; ``([], [])`` if none did."""
    at: dict[int, list[float]] = defaultdict(list)
    for r in rs:
        for m in r.metrics:
            if m.get("eval_return_mean") is not None:
                at[m["global_step"]].append(m["eval_return_mean"])
    steps = sorted(k for k, v in at.items() if len(v) == len(rs))
    return steps, [float(np.mean(at[k])) for k in steps]


def _legend_labels(bases: list[str], seeds: dict[str, set[int]],
                   same_at: dict[str, dict[str, list[str]]], n_points: int) -> dict[str, str]:
    out = {}
    for b in bases:
        label = f"{b} (n={len(seeds[b])})"
        for other, where in same_at[b].items():
            at = "" if len(where) == n_points else f" at {'; '.join(where)}"
            label += f", identical to {other}{at}"
        out[b] = label
    return out


def learning_curves(env: str, runs: list[Run], smooth: int = 1):
    """Mean training-episode return over seeds with a 95% band (1.96 standard errors), one
    colour per base condition, one panel per grid point (shared y axis); a curve identical to
    another is dashed with markers and its legend entry names the other."""
    points: dict[tuple, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in sorted(runs, key=lambda r: (base_condition(r), r.seed)):
        points[grid_point(r)][base_condition(r)].append(r)
    order = sorted(points, key=_sortable)
    bases = sorted({base_condition(r) for r in runs})
    colour = condition_colours(bases)
    last = max(r.metrics[-1]["global_step"] for r in runs)
    grid = np.linspace(0, last, 200)
    ncols = min(3, len(order))
    nrows = math.ceil(len(order) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(8, 4) if len(order) == 1 else
                             (4.3 * ncols, 3.3 * nrows + 0.8), sharey=True, squeeze=False)
    same_at: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    seeds: dict[str, set[int]] = defaultdict(set)
    for ax, point in zip(axes.flat, order):
        by_base = points[point]
        for b, rs in by_base.items():
            seeds[b] |= {r.seed for r in rs}
        for b, other in _panel(ax, by_base, colour, grid, smooth).items():
            same_at[b][other].append(point_label(point))
        if point:
            ax.set_title(point_label(point), fontsize=9)
        ax.set_xlabel("environment steps")
    for ax in axes.flat[len(order):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("episode return\n(mean over seeds, 95% band)")
    labels = _legend_labels(bases, seeds, same_at, len(order))
    twins = {o for b in bases for o in same_at[b]}
    handles = [Line2D([], [], color=colour[b], **(
        IDENTICAL_STYLE if same_at[b] else {"lw": 3.2, "alpha": 0.75} if b in twins else
        {"lw": 1.5})) for b in bases]
    names = [labels[b] for b in bases]
    if any(eval_curve(rs)[0] for p in points.values() for rs in p.values()):
        handles.append(Line2D([], [], color="grey", **EVAL_STYLE))
        names.append("deterministic evaluation (eval_every)")
    title = f"{env}: training-episode return ({window_text(smooth)})"
    if len(order) == 1:
        axes[0, 0].set_title(title + (f"\n{point_label(order[0])}" if order[0] else ""),
                             fontsize=10)
        axes[0, 0].legend(handles, names, title="condition",
                          title_fontsize=8, fontsize=8, loc="upper left",
                          bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        return fig
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.12 if len(bases) > 3 else 0.08, 1, 1))
    fig.legend(handles, names, title="condition", title_fontsize=8,
               fontsize=8, loc="lower center", ncol=min(3, len(bases)), frameon=False)
    return fig
