"""The report's rliable-style comparison of conditions, per environment (and policy): IQM with a
stratified bootstrap 95% CI, the performance profile (share of runs above each final return)
with its bootstrap band, and the probability of improvement of every condition over every other.

Scores are the final returns of the table (one per seed). Each environment is one task: scores
of different environments are never pooled (that needs a normalisation the runs do not give).
"""

from __future__ import annotations

import html
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from klppo.report import aggregate as A  # noqa: E402
from klppo.report.colours import PALETTE, condition_colours  # noqa: E402
from klppo.report.curves import IDENTICAL_STYLE  # noqa: E402
from klppo.report.grid import shown  # noqa: E402
from klppo.report.stats import Summary  # noqa: E402

__all__ = ["Comparison", "compare", "comparison_figure", "comparison_markdown",
           "comparison_html"]



@dataclass
class Comparison:
    env: str
    policy: str | None
    scores: dict[str, np.ndarray]
    """condition -> final return per seed (seeds without one left out)"""
    iqm: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """condition -> (IQM, CI low, CI high)"""
    improvement: dict[tuple[str, str], tuple[float, float, float]] = field(default_factory=dict)
    """(X, Y) -> (P(X > Y), CI low, CI high)"""
    taus: np.ndarray = field(default_factory=lambda: np.zeros(0))
    profile: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    """condition -> (share of runs above each tau, band low, band high)"""
    identical: dict[str, str] = field(default_factory=dict)
    """condition -> an earlier condition with the same score of every seed"""


def compare(summaries: list[Summary], reps: int = A.REPS) -> list[Comparison]:
    """One :class:`Comparison` per (env, policy) with at least two conditions that have scores."""
    groups: dict[tuple[str, str | None], dict[str, dict[int, float]]] = {}
    for s in summaries:
        vals = {k: v for k, v in s.per_seed.items() if not math.isnan(v)}
        if vals:
            groups.setdefault((s.env, s.policy), {})[s.condition] = vals
    out = []
    for (env, policy), per_cond in sorted(groups.items(), key=lambda kv: (kv[0][0],
                                                                         kv[0][1] or "")):
        if len(per_cond) < 2:
            continue
        scores = {c: np.array([v for _, v in sorted(d.items())]) for c, d in per_cond.items()}
        c = Comparison(env, policy, scores)
        with np.errstate(all="ignore"):
            for cond, x in scores.items():
                c.iqm[cond] = (A.iqm(x), *A.bootstrap_ci(x, reps))
            for cx in scores:
                for cy in scores:
                    if cx != cy:
                        c.improvement[(cx, cy)] = (
                            A.probability_of_improvement(scores[cx], scores[cy]),
                            *A.improvement_ci(scores[cx], scores[cy], reps))
            every, scale = A.scaled(np.concatenate(list(scores.values())))
            lo, hi = every.min(), every.max()
            c.taus = scale * (np.linspace(lo, hi, 101) if hi > lo else lo + np.array([-1, 0, 1]))
            for cond, x in scores.items():
                c.profile[cond] = A.performance_profile(x, c.taus, reps)
        conds = list(scores)
        for i, cond in enumerate(conds):
            twin = next((d for d in conds[:i] if d not in c.identical
                         and per_cond[d] == per_cond[cond]), None)
            if twin is not None:
                c.identical[cond] = twin
        out.append(c)
    return out


def _label(c: Comparison, cond: str) -> str:
    twin = c.identical.get(cond)
    return f"{shown(cond)} (n={len(c.scores[cond])})" + \
        (f", identical to {shown(twin)}" if twin else "")


def _iqm_panel(ax, c: Comparison, colour: dict[str, tuple]) -> None:
    conds = list(c.scores)
    for i, cond in enumerate(reversed(conds)):
        m, lo, hi = c.iqm[cond]
        ax.plot([lo, hi], [i, i], color=colour[cond], lw=6, alpha=0.5, solid_capstyle="butt")
        ax.plot([m], [i], "|", color="k", ms=13, mew=2)
    ax.set_yticks(range(len(conds)), [_label(c, x) for x in reversed(conds)], fontsize=8)
    ax.set_xlabel("final return: IQM (black) and stratified bootstrap 95% CI (bar)")
    ax.set_title("IQM over seeds", fontsize=9)
    ax.grid(alpha=0.3, axis="x")


def _profile_panel(ax, c: Comparison, conds: list[str], colour: dict[str, tuple]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for cond in conds:
            prof, lo, hi = c.profile[cond]
            style: dict[str, Any] = {"lw": 1.6}
            if cond in c.identical:
                style = IDENTICAL_STYLE | {"markevery": 10}
            elif cond in c.identical.values():
                style = {"lw": 3.2, "alpha": 0.75}
            ax.plot(c.taus, prof, color=colour[cond], drawstyle="steps-post", **style)
            if cond not in c.identical:
                ax.fill_between(c.taus, lo, hi, color=colour[cond], alpha=0.12, lw=0,
                                step="post")
    ax.set(xlabel="final return tau", ylim=(-0.03, 1.03))
    ax.grid(alpha=0.3)


def _legend(fig, c: Comparison, base_of: dict[str, str], colour: dict[str, tuple],
            n_points: int) -> None:
    """One legend for the profile panels: a line per base condition, saying which is
    identical to which (and where, when not in every panel)."""
    entries: dict[str, tuple] = {}
    same: dict[str, dict[str, int]] = {}
    for cond in c.scores:
        b = base_of.get(cond, cond)
        entries.setdefault(b, colour[cond])
        if cond in c.identical:
            other = base_of.get(c.identical[cond], c.identical[cond])
            same.setdefault(b, {}).setdefault(other, 0)
            same[b][other] += 1
    twins = {o for d in same.values() for o in d}
    handles, labels = [], []
    for b, col in entries.items():
        style = IDENTICAL_STYLE if b in same else {"lw": 3.2, "alpha": 0.75} if b in twins \
            else {"lw": 1.6}
        handles.append(Line2D([], [], color=col, **style))
        labels.append(b + "".join(f", identical to {o}" + ("" if k == n_points else
                                                             f" in {k} of {n_points} panels")
                                  for o, k in same.get(b, {}).items()))
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8,
               frameon=False, title="condition (colours as above)", title_fontsize=8)


def comparison_figure(c: Comparison, base_of: dict[str, str], point_of: dict[str, str],
                      bases: list[str]):
    """IQM with its 95% CI per condition (top) and the performance profile with its 95% band,
    one panel per grid point (below). Colours are the learning curves' (one per base
    condition, ``base_of``); ``point_of`` gives each condition's grid point (``""``: none)."""
    conds = list(c.scores)
    by_base = condition_colours(bases)
    colour = {k: by_base.get(base_of.get(k, k), PALETTE[0]) for k in conds}
    points = list(dict.fromkeys(point_of.get(k, "") for k in conds))
    ncols = min(3, len(points))
    nrows = math.ceil(len(points) / ncols)
    top = 0.6 + 0.3 * len(conds)
    fig = plt.figure(figsize=(10, top + 3.2 * nrows + 0.9))
    grid = fig.add_gridspec(1 + nrows, ncols, height_ratios=[top] + [3.2] * nrows)
    _iqm_panel(fig.add_subplot(grid[0, :]), c, colour)
    first = None
    for i, point in enumerate(points):
        ax = fig.add_subplot(grid[1 + i // ncols, i % ncols], sharey=first)
        first = first or ax
        mine = [k for k in conds if point_of.get(k, "") == point]
        _profile_panel(ax, c, mine, colour)
        ax.set_title("performance profile" + (f", {point}" if point else ""), fontsize=9)
        if i % ncols == 0:
            ax.set_ylabel("share of runs with\nfinal return > tau (95% band)")
    who = f" / policy {c.policy}" if c.policy is not None else ""
    fig.suptitle(f"{c.env}{who}: final returns over seeds (rliable-style aggregates)",
                 fontsize=10)
    rows = math.ceil(len({base_of.get(k, k) for k in conds}) / 3)
    fig.tight_layout(rect=(0, (0.3 + 0.17 * rows) / fig.get_figheight(), 1, 1))
    _legend(fig, c, base_of, colour, len(points))
    return fig


def _cell(v: tuple[float, float, float]) -> str:
    return f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"


def comparison_markdown(comps: list[Comparison], heading: bool = True) -> str:
    """IQM and probability-of-improvement tables of every comparison (aggregates.md)."""
    lines = ["# Aggregates over seeds (rliable-style)", ""] if heading else []
    lines += ["IQM: interquartile mean of the final returns (all seeds with 3 or fewer: the "
             "mean), stratified bootstrap 95% CI. P(X > Y): probability that a run of X ends "
             "above a run of Y (ties count 1/2), bootstrap 95% CI.", ""]
    for c in comps:
        who = f" / policy {c.policy}" if c.policy is not None else ""
        lines += [f"{'##' if heading else '###'} {c.env}{who}", "",
                  "| condition | seeds | IQM [95% CI] |", "|---|---|---|"]
        lines += [f"| {shown(k)} | {len(c.scores[k])} | {v[0]:.1f} [{v[1]:.1f}, {v[2]:.1f}] |"
                  for k, v in c.iqm.items()]
        conds = list(c.scores)
        lines += ["", "| P(row > column) | " + " | ".join(map(shown, conds)) + " |",
                  "|---|" + "---|" * len(conds)]
        for x in conds:
            lines.append(f"| {shown(x)} | " + " | ".join(
                "—" if x == y else _cell(c.improvement[(x, y)]) for y in conds) + " |")
        lines.append("")
    return "\n".join(lines)


def comparison_html(c: Comparison) -> str:
    """The probability-of-improvement matrix of one comparison as an HTML table."""
    def name(x: str) -> str:  # long grid labels may break after a comma
        return html.escape(shown(x)).replace(", ", ",<wbr> ")

    def cell(v: tuple[float, float, float]) -> str:
        return f"{v[0]:.2f}<br><span class='muted'>[{v[1]:.2f}, {v[2]:.2f}]</span>"

    conds = list(c.scores)
    head = "".join(f"<th>{name(y)}</th>" for y in conds)
    rows = []
    for x in conds:
        cells = "".join("<td>—</td>" if x == y else f"<td>{cell(c.improvement[(x, y)])}</td>"
                        for y in conds)
        rows.append(f"<tr><th style='text-align:left'>{name(x)}</th>{cells}</tr>")
    return (f"<div class='wide'><table class='poi'><tr><th>P(row &gt; column)</th>{head}</tr>"
            f"{''.join(rows)}</table></div>")
