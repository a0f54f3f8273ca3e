"""A ``klppo tune`` study in the report: each trial's parameters, state and value, the study's
history (value per trial and the best so far) and the parameters' importance, all read from
the study's ``index.json`` (the report imports no Optuna)."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["Study", "read_study", "trials_markdown", "history_figure", "study_html"]


@dataclass
class Study:
    path: Path
    trials: list[dict[str, Any]]
    """per trial: number, state, value (None when it has none), params, runs, error"""
    best: int | None
    importance: dict[str, float]

    @property
    def params(self) -> list[str]:
        return sorted({k for t in self.trials for k in t["params"]})


def _trial(x: Any) -> dict[str, Any] | None:
    if not isinstance(x, dict) or not isinstance(x.get("number"), int):
        return None
    value = x.get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value):
        value = None
    return {"number": x["number"], "state": str(x.get("state", "?")),
            "value": None if value is None else float(value),
            "params": x["params"] if isinstance(x.get("params"), dict) else {},
            "runs": x.get("runs") if isinstance(x.get("runs"), list) else [],
            "error": x.get("error")}


def read_study(path: str | Path) -> Study | None:
    """The study in ``path`` (a ``klppo tune`` directory), or None when it is none; a
    malformed trial entry is left out."""
    try:
        index = json.loads((Path(path) / "index.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or index.get("kind") != "tune" \
            or not isinstance(index.get("trials"), list):
        return None
    trials = [t for t in map(_trial, index["trials"]) if t is not None]
    best = index.get("best_trial") if isinstance(index.get("best_trial"), int) else None
    imp: dict[Any, Any] = index["importance"] if isinstance(index.get("importance"), dict) \
        else {}
    importance = {str(k): float(v) for k, v in imp.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return Study(Path(path), sorted(trials, key=lambda t: t["number"]), best, importance)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def trials_markdown(s: Study) -> str:
    """One row per trial: number (best marked), state, value, each parameter."""
    head = ["trial", "state", "value", *s.params]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in s.trials:
        mark = " (best)" if t["number"] == s.best else ""
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        cells = [f"{t['number']}{mark}", t["state"], value,
                 *(_fmt(t["params"].get(p, "-")) for p in s.params)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def history_figure(s: Study):
    """The value of each trial (complete: filled; pruned: hollow, its last estimate) with the
    best complete value so far, and (right) the parameters' importance."""
    wide = bool(s.importance)
    fig, axes = plt.subplots(1, 2 if wide else 1, figsize=(11 if wide else 7, 3.6),
                             gridspec_kw={"width_ratios": [2, 1]} if wide else None)
    ax = axes[0] if wide else axes
    for state, style in (("complete", {"color": "C0"}),
                         ("pruned", {"facecolors": "none", "edgecolors": "C1"})):
        pts = [(t["number"], t["value"]) for t in s.trials
               if t["state"] == state and t["value"] is not None]
        if pts:
            ax.scatter(*zip(*pts), s=28, label=f"{state} ({len(pts)})", zorder=3, **style)
    best, run = [], -math.inf
    for t in s.trials:
        if t["state"] == "complete" and t["value"] is not None:
            run = max(run, t["value"])
        best.append((t["number"], run if run > -math.inf else math.nan))
    if best:
        ax.step(*zip(*best), where="post", color="k", lw=1.2, label="best so far")
    ax.set(xlabel="trial", ylabel="value (mean final return)",
           title=f"{s.path.name}: {len(s.trials)} trials")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if wide:
        names = sorted(s.importance, key=lambda n: s.importance[n])
        axes[1].barh(names, [s.importance[n] for n in names], color="C2")
        axes[1].set(xlabel="importance (PED-ANOVA, sums to 1)", title="parameters")
        axes[1].tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    return fig


def study_html(s: Study, figure: Path, img_tag) -> list[str]:  # type: ignore[no-untyped-def]
    """The report's section for the study: history, importance and the trials table."""
    e = html.escape
    counts: dict[str, int] = {}
    for t in s.trials:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    said = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    parts = [f"<h2>Tuning study {e(str(s.path))}</h2>",
             f"<p class='muted'>{len(s.trials)} trials ({e(said)}). A trial's value is the mean "
             "final return of its runs; a pruned trial stopped early and its value is the "
             "last estimate (its runs are labelled <i>(pruned)</i> in the tables above). "
             "An invalid draw was refused before training.</p>",
             f"<figure>{img_tag(figure)}<figcaption>value per trial, best so far"
             + (", and the parameters' importance" if s.importance else "")
             + "</figcaption></figure>", "<table><tr><th>trial</th><th>state</th><th>value</th>"]
    parts += [f"<th>{e(p)}</th>" for p in s.params] + ["</tr>"]
    for t in s.trials:
        best = " class='ok'" if t["number"] == s.best else ""
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        cells = "".join(f"<td>{e(_fmt(t['params'].get(p, '-')))}</td>" for p in s.params)
        parts.append(f"<tr{best}><td>{t['number']}</td><td>{e(t['state'])}</td>"
                     f"<td>{value}</td>{cells}</tr>")
    parts.append("</table>")
    return parts
