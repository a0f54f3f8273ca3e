"""``make_report(paths, out_dir)``: tables, figures and one self-contained report.html.

Reads run directories only (no torch). Runs are grouped by environment, so runs of different
environments never share a table; everything unreadable is listed with the reason it was skipped.
A multi-agent run counts once per policy (:meth:`Run.of_policy`): its table rows, curves, KL
panels and partitions are per (condition, policy), and the tables gain a ``policy`` column.
"""

from __future__ import annotations

import csv
import math
import re
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from klppo.report import figures as F
from klppo.report.html import render_html
from klppo.report.load import Run, load_runs, merge_commits, run_machines
from klppo.report.stats import Summary, summarize

__all__ = ["Report", "make_report", "equivalence", "format_table", "units", "has_policies"]


@dataclass
class Equivalence:
    env: str
    seed: int
    max_abs_diff: float
    iterations: int
    policy: str | None = None


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


def units(runs: list[Run]) -> list[Run]:
    """What the report counts: each single-agent run, and each policy of each multi-agent run
    (:meth:`Run.of_policy`)."""
    return [u for r in runs for u in ([r.of_policy(p) for p in r.policies] or [r])]


def equivalence(runs: list[Run]) -> list[Equivalence]:
    """Max |difference| of the return curves of clip and per_sample_kl (clip shape) runs that
    share env and seed (0 expected with power-of-two minibatches: Theorem 1); per policy for
    multi-agent runs (given as :func:`units`)."""
    def is_psk_clip(r: Run) -> bool:
        return r.objective == "per_sample_kl" and (r.config.get("ppo") or {}).get(
            "shape", "clip") == "clip"

    out = []
    pairs: dict[tuple[str, int, str | None], dict[str, Run]] = defaultdict(dict)
    for r in runs:
        if r.objective == "clip":
            pairs[(r.env, r.seed, r.policy)]["clip"] = r
        elif is_psk_clip(r):
            pairs[(r.env, r.seed, r.policy)]["psk"] = r
    for (env, seed, policy), p in sorted(pairs.items(), key=lambda kv: (*kv[0][:2],
                                                                        kv[0][2] or "")):
        if len(p) < 2:
            continue
        a = [m.get("episode_return_mean") for m in p["clip"].metrics]
        b = [m.get("episode_return_mean") for m in p["psk"].metrics]
        n = min(len(a), len(b))
        diffs = []
        for x, y in zip(a[:n], b[:n]):
            if x is None and y is None:
                diffs.append(0.0)
            elif x is None or y is None:
                diffs.append(math.inf)
            else:
                diffs.append(abs(x - y))
        out.append(Equivalence(env, seed, max(diffs) if diffs else math.nan, n, policy))
    return out


def has_policies(rows: list[Summary] | list[Equivalence]) -> bool:
    """Whether a table has multi-agent rows, and so a ``policy`` column (``—`` for the
    single-agent rows); single-agent tables are as they always were."""
    return any(r.policy is not None for r in rows)


def format_table(summaries: list[Summary]) -> str:
    """Markdown final-return table (KLip-PPO protocol) with IQM and its bootstrap 95% CI; one
    row per (env, condition), or per (env, condition, policy) for multi-agent runs."""
    marl = has_policies(summaries)
    lines = [f"| env | condition | {'policy | ' if marl else ''}seeds | final return "
             "(mean ± std) | IQM [95% CI] |", "|---|---|---|---|---|" + ("---|" if marl else "")]
    for s in summaries:
        pol = f"{s.policy or '—'} | " if marl else ""
        lines.append(f"| {s.env} | {s.condition} | {pol}{s.n} | {s.mean:.1f} ± {s.std:.1f} | "
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


def _write_equivalence(out: Path, eqs: list[Equivalence]) -> None:
    marl = has_policies(eqs)
    md = [f"| env | seed | {'policy | ' if marl else ''}iterations | max abs diff of return "
          "curves |", "|---|---|---|---|" + ("---|" if marl else "")]
    for e in eqs:
        pol = f"{e.policy or '—'} | " if marl else ""
        md.append(f"| {e.env} | {e.seed} | {pol}{e.iterations} | {e.max_abs_diff:.3g} |")
    (out / "equivalence.md").write_text("\n".join(md) + "\n")
    with open(out / "equivalence.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["env", "seed", *(["policy"] if marl else []), "iterations", "max_abs_diff"])
        for e in eqs:
            w.writerow([e.env, e.seed, *([e.policy or ""] if marl else []), e.iterations,
                        e.max_abs_diff])


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
    who, stem, part = "", safe, str
    if policy is not None:
        who, stem, part = f" / policy {policy}", f"{safe}__{_safe(policy)}", _safe
    figures = [(f"{env}{who}: learning curves",
                F.save(F.learning_curves(f"{env}{who}", rs, smooth), fig_dir,
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
        figures.append((f"{env} / {cond}{who}: {what}, seeds {seeds}.{note}",
                        F.save(F.kl_tracking(env, f"{cond}{who}", crs, smooth), fig_dir,
                               f"{stem}__{part(cond)}__kl")))
    for cond, crs in sorted(clip_like.items()):
        figures.append((f"{env} / {cond}{who}: partition (kill, pass, in) and beta_t",
                        F.save(F.partitions(env, f"{cond}{who}", crs, smooth), fig_dir,
                               f"{stem}__{part(cond)}__partition")))
    return figures


def make_report(paths: list[str | Path], out_dir: str | Path, smooth: int = 1,
                finished_only: bool = False) -> Report:
    """Tables, figures and report.html for the runs under ``paths``, written to ``out_dir``.

    ``smooth``: the figures' curves are trailing moving averages over that many iterations
    (1: raw). The tables never smooth. ``finished_only``: leave out runs that did not finish
    (listed in ``skipped``)."""
    if not isinstance(smooth, int) or isinstance(smooth, bool) or smooth < 1:
        raise ValueError(f"smooth={smooth!r}: must be an integer >= 1 (iterations)")
    out = Path(out_dir)
    fig_dir = out / "figures"
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_runs(paths, finished_only)
    runs = loaded.runs
    notes = [f"{r.path}: {n}" for r in runs for n in r.notes]
    by_env: dict[str, list[Run]] = defaultdict(list)
    for r in units(runs):
        by_env[r.env].append(r)
    summaries: list[Summary] = []
    figures: list[tuple[str, Path]] = []
    for env, rs in sorted(by_env.items()):
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
        summaries += [summarize(env, c, s, p) for (c, p), s in
                      sorted(by_cond.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]
        figures += _env_figures(env, rs, fig_dir, smooth)
    eqs = equivalence(units(runs))
    table = format_table(summaries)
    (out / "final_returns.md").write_text(table + "\n")
    _write_csv(out / "final_returns.csv", summaries)
    _write_equivalence(out, eqs)
    machines = merge_commits([m for r in runs for m in run_machines(r.metadata)])
    html = out / "report.html"
    html.write_text(render_html(summaries, eqs, figures, runs, loaded.skipped, notes,
                                smooth=smooth, machines=machines))
    return Report(out, html, summaries, eqs, loaded.skipped, figures, notes, machines)


