"""``make_report(paths, out_dir)``: tables, figures and one self-contained report.html.

Reads run directories only (no torch). Runs are grouped by environment, so runs of different
environments never share a table; everything unreadable is listed with the reason it was skipped.
A sweep's grid axes (:mod:`klppo.report.grid`) facet the learning curves and key the
equivalence table; the conditions are compared rliable-style (:mod:`klppo.report.compare`).
A multi-agent run counts once per policy (:meth:`Run.of_policy`): its table rows, curves, KL
panels and partitions are per (condition, policy), and the tables gain a ``policy`` column.
"""

from __future__ import annotations

import csv
import math
import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from klppo.report import curves as C
from klppo.report import figures as F
from klppo.report.compare import Comparison, compare, comparison_figure, comparison_markdown
from klppo.report.equivalence import (
    Equivalence,
    equivalence,
    has_policies,
    unpaired_notes,
    write_equivalence,
)
from klppo.report.grid import assign_axes, base_condition, grid_point, point_label, shown
from klppo.report.html import render_html
from klppo.report.load import Run, load_runs, merge_commits, run_machines
from klppo.report.stats import Summary, summarize
from klppo.runs.errors import InputError

__all__ = ["Report", "NoRunsError", "REPORT_FILES", "earlier_report", "make_report",
           "equivalence", "format_table", "units", "has_policies", "Equivalence"]


@dataclass
class Report:
    out_dir: Path
    html: Path
    summaries: list[Summary]
    equivalences: list[Equivalence]
    skipped: list[tuple[str, str]]
    figures: list[tuple[str, Path]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machines: list[str] = field(default_factory=list)
    """the machines (and software) the runs were measured on, one line each"""
    comparisons: list[Comparison] = field(default_factory=list)
    """per env (and policy): IQM, performance profile, probability of improvement"""


class NoRunsError(InputError):
    """``klppo report`` found no readable run: nothing is written."""

    def __init__(self, paths: list[str | Path], skipped: list[tuple[str, str]]) -> None:
        named = ", ".join(str(p) for p in paths)
        why = f"; {len(skipped)} skipped, first: {skipped[0][0]}: {skipped[0][1]}" if skipped \
            else ""
        super().__init__(f"no readable run found in {named}{why}")


def units(runs: list[Run]) -> list[Run]:
    """What the report counts: each single-agent run, and each policy of each multi-agent run
    (:meth:`Run.of_policy`)."""
    return [u for r in runs for u in ([r.of_policy(p) for p in r.policies] or [r])]


def format_table(summaries: list[Summary]) -> str:
    """Markdown final-return table (KLip-PPO protocol) with IQM and its bootstrap 95% CI; one
    row per (env, condition), or per (env, condition, policy) for multi-agent runs."""
    marl = has_policies(summaries)
    lines = [f"| env | condition | {'policy | ' if marl else ''}seeds | final return "
             "(mean ± std) | IQM [95% CI] |", "|---|---|---|---|---|" + ("---|" if marl else "")]
    for s in summaries:
        pol = f"{s.policy or '—'} | " if marl else ""
        lines.append(f"| {s.env} | {shown(s.condition)} | {pol}{s.n} | "
                     f"{s.mean:.1f} ± {s.std:.1f} | "
                     f"{s.iqm:.1f} [{s.ci_low:.1f}, {s.ci_high:.1f}] |")
    return "\n".join(lines)


def _write_csv(path: Path, summaries: list[Summary]) -> None:
    marl = has_policies(summaries)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["env", "condition", *(["policy"] if marl else []), "seeds", "mean", "std",
                    "iqm", "ci_low", "ci_high", "per_seed"])
        for s in summaries:
            w.writerow([s.env, s.condition, *([s.policy or ""] if marl else []), s.n, s.mean,
                        s.std, s.iqm, s.ci_low, s.ci_high,
                        ";".join(f"{k}:{v}" for k, v in sorted(s.per_seed.items()))])


def _safe(name: str) -> str:
    """A part of a figure's file name: '/', ':' and white space become '-'."""
    return re.sub(r"[/:\s]", "-", name)


def _env_figures(env: str, rs: list[Run], fig_dir: Path,
                 smooth: int) -> list[tuple[str, Path]]:
    """Learning curves; per penalised condition, KL vs target and beta (seeds overlaid); per
    clip-like condition, the partition and beta_t. ``(caption, png)`` pairs. A multi-agent
    env's figures are per policy, in the order the runs log their policies."""
    groups: dict[str | None, list[Run]] = defaultdict(list)
    for r in rs:
        groups[r.policy].append(r)
    # values near the float limit (a run logs +-inf as +-1e308) overflow in matplotlib's
    # ticks and bands: the figure is still drawn, and no numeric warning reaches the user
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [f for policy, prs in groups.items()
                for f in _group_figures(env, prs, fig_dir, smooth, policy)]


def _group_figures(env: str, rs: list[Run], fig_dir: Path, smooth: int,
                   policy: str | None) -> list[tuple[str, Path]]:
    """:func:`_env_figures` of the runs of one env, or of one policy's views of them."""
    safe = env.replace("/", "-").replace(":", "-")
    part: Callable[[str], str] = str
    who, stem = "", safe
    if policy is not None:
        who, stem, part = f" / policy {policy}", f"{safe}__{_safe(policy)}", _safe
    window = f" Curves: {C.window_text(smooth)}."
    axes = sorted({a for r in rs for a in r.axes if a != "env"})
    facets = f" One panel per value of {', '.join(axes)}." if axes else ""
    figures = [(f"{env}{who}: learning curves, mean over seeds with a 95% band.{facets}"
                f"{window}", F.save(C.learning_curves(f"{env}{who}", rs, smooth), fig_dir,
                                    f"{stem}__curves"))]
    penalised: dict[str, list[Run]] = defaultdict(list)
    clip_like: dict[str, list[Run]] = defaultdict(list)
    for r in rs:
        if r.objective in ("kl_penalty", "clip_kl"):
            penalised[r.condition].append(r)
        elif r.objective in ("clip", "per_sample_kl") and "frac_kill" in r.metrics[0]:
            clip_like[r.condition].append(r)
    for cond, crs in sorted(penalised.items()):
        seeds = ", ".join(str(r.seed) for r in sorted(crs, key=lambda r: r.seed))
        what = "KL vs target and beta" if F.has_target(crs) is not None else \
            "KL and beta (fixed beta: no target)"
        note = f" {F.ANNEAL_NOTE}" if F.lr_anneals(crs) else ""
        figures.append((f"{env} / {shown(cond)}{who}: {what}, seeds {seeds}.{window}{note}",
                        F.save(F.kl_tracking(env, f"{shown(cond)}{who}", crs, smooth), fig_dir,
                               f"{stem}__{part(cond)}__kl")))
    for conds, crs in _same_partitions(clip_like):
        names = [shown(c) for c in conds]  # identical partitions: one figure naming them all
        cond = " = ".join(names)
        same = f" {' and '.join(names)} are identical, seed for seed." if len(conds) > 1 else ""
        figures.append((f"{env} / {cond}{who}: partition (kill, pass, in) and |beta_t|, the "
                        "per-sample KL coefficient the clip applies on the kill set (0 "
                        f"elsewhere).{same}{window}",
                        F.save(F.partitions(env, f"{cond}{who}", crs, smooth), fig_dir,
                               f"{stem}__{part(conds[0])}__partition")))
    return figures


_PARTITION_KEYS = ("frac_kill", "frac_pass", "frac_in", "beta_t_q50", "beta_t_q90", "beta_t_q99")


def _same_partitions(by_cond: dict[str, list[Run]]) -> list[tuple[list[str], list[Run]]]:
    """The conditions grouped by their partition curves: conditions whose runs log the same
    partition metrics seed for seed (clip and per_sample_kl, Theorem 1) share one group."""
    def signature(crs: list[Run]) -> tuple:
        return tuple((r.seed, tuple(tuple(m.get(k) for k in _PARTITION_KEYS) for m in r.metrics))
                     for r in sorted(crs, key=lambda r: r.seed))

    groups: dict[tuple, list[str]] = {}
    for cond, crs in sorted(by_cond.items()):
        groups.setdefault(signature(crs), []).append(cond)
    return [(conds, by_cond[conds[0]]) for conds in groups.values()]


def _comparison_figures(comps: list[Comparison], rs: list[Run],
                        fig_dir: Path) -> list[tuple[str, Path]]:
    bases = sorted({base_condition(r) for r in rs})
    base_of = {r.condition: base_condition(r) for r in rs}
    point_of = {r.condition: point_label(grid_point(r)) for r in rs}
    out = []
    for c in comps:
        who = f"__{_safe(c.policy)}" if c.policy is not None else ""
        fig = comparison_figure(c, base_of, point_of, bases)
        out.append((f"{c.env}{' / policy ' + c.policy if c.policy else ''}: IQM of the final "
                    "returns with stratified bootstrap 95% CIs (top) and the performance "
                    "profile, the share of runs whose final return is above tau, with its "
                    "bootstrap 95% band (below" + ("; one panel per grid point)."
                                                    if any(point_of.values()) else ")."),
                    F.save(fig, fig_dir, f"{_safe(c.env)}{who}__aggregates")))
    return out


def _summaries(env: str, rs: list[Run], notes: list[str]) -> list[Summary]:
    by_cond: dict[tuple[str, str | None], dict[int, float]] = defaultdict(dict)
    for r in rs:
        if r.seed in by_cond[(r.condition, r.policy)]:
            note = (f"{r.path}: a second run of {env} / {r.condition} / seed {r.seed}; the "
                    "first one found is used")
            if note not in notes:  # once for a multi-agent run, not once per policy
                notes.append(note)
            continue
        by_cond[(r.condition, r.policy)][r.seed] = r.final_return
        if math.isnan(r.final_return):
            who = f" (policy {r.policy})" if r.policy is not None else ""
            notes.append(f"{r.path}{who}: no training episode ended in the last 10% of "
                         "the steps, so it has no final return (left out of the table)")
    return [summarize(env, c, s, p) for (c, p), s in
            sorted(by_cond.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]


def _studies(paths: list[str | Path], out: Path, fig_dir: Path) -> list[str]:
    """The HTML of each ``klppo tune`` study among ``paths``; writes trials.md (the trials of
    every study) and each study's history figure."""
    from klppo.report.html import img_tag
    from klppo.report.tuning import history_figure, read_study, study_html, trials_markdown

    parts: list[str] = []
    tables: list[str] = []
    for i, study in enumerate(s for s in map(read_study, paths) if s is not None):
        figure = F.save(history_figure(study), fig_dir, f"study_{i}")
        parts += study_html(study, figure, img_tag)
        tables.append(f"## {study.path}\n\n{trials_markdown(study)}")
    if tables:
        (out / "trials.md").write_text("\n".join(tables))
    return parts


def final_returns(paths: list[str | Path], finished_only: bool = False) -> list[Summary]:
    """The table of a report (final return per env and condition over seeds) for the runs
    under ``paths``, writing nothing; empty when no run can be read."""
    runs = load_runs(paths, finished_only).runs
    by_env: dict[str, list[Run]] = defaultdict(list)
    for r in assign_axes(units(runs)):
        by_env[r.env].append(r)
    notes: list[str] = []
    return [s for env, rs in sorted(by_env.items()) for s in _summaries(env, rs, notes)]


#: what a report writes into its directory
REPORT_FILES = ("report.html", "final_returns.md", "final_returns.csv", "equivalence.md",
                "equivalence.csv", "aggregates.md", "trials.md", "figures")


def earlier_report(out_dir: str | Path) -> list[str]:
    """The files of :data:`REPORT_FILES` already in ``out_dir`` (an earlier report)."""
    out = Path(out_dir)
    return [n for n in REPORT_FILES if (out / n).exists()] if out.is_dir() else []


def _clear_figures(fig_dir: Path) -> None:
    """An earlier report's figures (PNG and SVG only) in ``fig_dir``: a rewritten report
    leaves none of them behind."""
    if fig_dir.is_dir():
        for p in fig_dir.iterdir():
            if p.is_file() and p.suffix in (".png", ".svg"):
                p.unlink()


def make_report(paths: list[str | Path], out_dir: str | Path, smooth: int | None = None,
                finished_only: bool = False) -> Report:
    """Tables, figures and report.html for the runs under ``paths``, written to ``out_dir``.

    ``smooth``: the figures' curves are trailing moving averages over that many iterations
    (1: raw; None: :func:`klppo.report.curves.auto_smooth` per env, about 5% of its runs'
    iterations), stated in each figure. The tables never smooth. ``finished_only``: leave out
    runs that did not finish (listed in ``skipped``). No readable run: :class:`NoRunsError`
    before ``out_dir`` is made. Files of an earlier report in ``out_dir`` are replaced (the
    command line refuses that without ``--force``)."""
    if smooth is not None and (not isinstance(smooth, int) or isinstance(smooth, bool)
                               or smooth < 1):
        raise ValueError(f"smooth={smooth!r}: must be an integer >= 1 (iterations)")
    loaded = load_runs(paths, finished_only)
    runs = loaded.runs
    if not runs:
        raise NoRunsError(paths, loaded.skipped)
    out = Path(out_dir)
    fig_dir = out / "figures"
    out.mkdir(parents=True, exist_ok=True)
    _clear_figures(fig_dir)
    notes = [f"{r.path}: {n}" for r in runs for n in r.notes]
    views = assign_axes(units(runs))
    by_env: dict[str, list[Run]] = defaultdict(list)
    for r in views:
        by_env[r.env].append(r)
    summaries: list[Summary] = []
    figures: list[tuple[str, Path]] = []
    windows: dict[str, int] = {}
    for env, rs in sorted(by_env.items()):
        windows[env] = smooth if smooth is not None else C.auto_smooth(rs)
        env_summaries = _summaries(env, rs, notes)
        summaries += env_summaries
        figures += _env_figures(env, rs, fig_dir, windows[env])
    comps = compare(summaries)
    comp_figs = [f for env, rs in sorted(by_env.items()) for f in _comparison_figures(
        [c for c in comps if c.env == env], rs, fig_dir)]
    eqs = equivalence(views)
    notes += unpaired_notes(views)
    (out / "final_returns.md").write_text(format_table(summaries) + "\n")
    _write_csv(out / "final_returns.csv", summaries)
    write_equivalence(out, eqs)
    (out / "aggregates.md").write_text(comparison_markdown(comps))
    machines = merge_commits([m for r in runs for m in run_machines(r.metadata)])
    studies = _studies(paths, out, fig_dir)
    html = out / "report.html"
    html.write_text(render_html(summaries, eqs, figures, runs, loaded.skipped, notes,
                                windows=windows, machines=machines, comparisons=comps,
                                comparison_figures=comp_figs, sections=studies))
    return Report(out, html, summaries, eqs, loaded.skipped, figures + comp_figs, notes,
                  machines, comps)
