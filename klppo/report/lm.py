"""The RLHF comparison report: reward, KL against its target, beta and held-out perplexity per
arm, the second-half summary table, and sample texts. Reads run directories only (no torch)."""

from __future__ import annotations

import csv
import html
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

from klppo.report.colours import condition_colours  # noqa: E402
from klppo.report.curves import IDENTICAL_STYLE  # noqa: E402
from klppo.report.figures import save  # noqa: E402
from klppo.report.html import CSS, img_tag, machines_html  # noqa: E402
from klppo.report.load import merge_commits, read_metadata, run_machines  # noqa: E402
from klppo.runs.metrics import read_metrics  # noqa: E402

__all__ = ["ArmSummary", "CURVE_FIELDS", "lm_report", "summarize_arm"]


@dataclass
class ArmSummary:
    arm: str
    seeds: int
    kl_second_half: float  # mean over seeds of the second-half mean KL (kl_unit)
    kl_abs_error_second_half: float
    max_seed_abs_error: float  # worst seed's |second-half mean KL - target|
    score_second_half: float
    final_beta: float
    final_perplexity: float
    distinct_2: float
    kl_unit: str
    target: float


def summarize_arm(arm: str, runs: list[list[dict]]) -> ArmSummary:
    """Second-half statistics (iterations after the midpoint), averaged over seeds."""
    kls, errs, scores, betas, ppls, d2 = [], [], [], [], [], []
    target = runs[0][0]["kl_target"]
    for recs in runs:
        half = recs[len(recs) // 2:]
        k = float(np.mean([r["kl"] for r in half]))
        kls.append(k)
        errs.append(abs(k - target))
        scores.append(float(np.mean([r["score"] for r in half])))
        betas.append(recs[-1]["beta_after"])
        ppl = [r["held_out_perplexity"] for r in recs if "held_out_perplexity" in r]
        ppls.append(ppl[-1] if ppl else float("nan"))
        d2.append(float(np.mean([r["distinct_2"] for r in half])))
    return ArmSummary(arm, len(runs), float(np.mean(kls)), float(np.mean(errs)),
                      float(np.max(errs)), float(np.mean(scores)), float(np.mean(betas)),
                      float(np.mean(ppls)), float(np.mean(d2)), runs[0][0]["kl_unit"], target)


def _curves(by_arm: dict[str, list[list[dict]]], key: str, title: str, ylabel: str, log=False,
            target=None, sparse=False):
    fig, ax = plt.subplots(figsize=(7, 3.4))
    colour = condition_colours(by_arm)
    drawn: dict[str, tuple] = {}
    for arm, runs in sorted(by_arm.items()):
        xs = [r["episodes"] for r in runs[0] if key in r]
        ys = np.array([[r[key] for r in recs if key in r] for recs in runs], float)
        init = f"{key}_initial"  # the value before any update, plotted at episode 0
        if all(init in recs[0] for recs in runs):
            xs = [0] + xs
            ys = np.concatenate([[[recs[0][init]] for recs in runs], ys], 1)
        n = min(len(xs), ys.shape[1])
        x, y = list(xs[:n]), ys[:, :n].mean(0)
        twin = next((a for a, (tx, ty) in drawn.items() if tx == x and np.array_equal(ty, y)),
                    None)
        drawn[arm] = (x, y)
        if twin is not None:  # drawn over its twin, dashed with markers: both stay visible
            ax.plot(x, y, label=f"{arm}, identical to {twin}", color=colour[arm],
                    **(IDENTICAL_STYLE | {"markevery": max(1, len(x) // 12)}))
            continue
        ls = "--" if arm.startswith("fixed") else "-"
        ax.plot(x, y, ls=ls, marker="o" if sparse else None, ms=3, label=arm,
                color=colour[arm])
    if target is not None:
        ax.axhline(target, color="k", lw=1, ls=":", label=f"target {target:g}")
    ax.set(title=title, xlabel="episodes", ylabel=ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    # outside the axes: inside, the legend sat on the KL curves near the target
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def _common_length(by_arm: dict[str, list[list[dict]]]) -> int | None:
    """Cut every run to the records all of them have (runs of a stopped comparison end at
    different iterations; curves and second halves then cover the same iterations): the common
    length when a cut was needed, else None."""
    lengths = [len(recs) for runs in by_arm.values() for recs in runs]
    if len(set(lengths)) == 1:
        return None
    n = min(lengths)
    for runs in by_arm.values():
        runs[:] = [recs[:n] for recs in runs]
    return n


#: the per-iteration columns of ``curves.csv`` (the data every number of the report comes from)
CURVE_FIELDS = ("iteration", "episodes", "kl", "kl_target", "beta", "beta_after", "score",
                "held_out_perplexity", "distinct_2")


@dataclass
class _Runs:
    by_arm: dict[str, list[list[dict]]]
    names: dict[str, list[str]]  # the run directories' names, as by_arm
    skipped: list[tuple[str, str]]
    machines: list[str]


def _read_runs(compare_dir: Path) -> _Runs:
    runs = _Runs(defaultdict(list), defaultdict(list), [], [])
    for d in sorted((compare_dir / "runs").iterdir()):
        if not (d / "metrics.jsonl").exists():
            runs.skipped.append((d.name, "no metrics.jsonl"))
            continue
        recs, _ = read_metrics(d / "metrics.jsonl")
        if not recs:
            runs.skipped.append((d.name, "no complete record"))
            continue
        arm = d.name.rsplit("__", 1)[0]
        runs.by_arm[arm].append(recs)
        runs.names[arm].append(d.name)
        runs.machines += run_machines(read_metadata(d / "metadata.json"))
    if not runs.by_arm:
        raise FileNotFoundError(f"{compare_dir}: no RLHF run with metrics")
    runs.machines = merge_commits(runs.machines) if any(runs.machines) else []
    return runs


def _write_curves(runs: _Runs, path: Path) -> None:
    """``curves.csv``: one row per run and iteration read (after any common cut), the columns
    of :data:`CURVE_FIELDS` (empty where a record lacks one), so a snapshot carries its data."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("run", "arm", *CURVE_FIELDS))
        for arm in sorted(runs.by_arm):
            for name, recs in zip(runs.names[arm], runs.by_arm[arm]):
                for r in recs:
                    w.writerow((name, arm, *(r.get(k, "") for k in CURVE_FIELDS)))


def _figures(by_arm: dict[str, list[list[dict]]], figs_dir: Path, unit: str,
             target: float) -> list[tuple[str, Path]]:
    mean = "per arm, mean over seeds"
    return [
        (f"task score (VADER compound) {mean}",
         save(_curves(by_arm, "score", "task score (VADER compound)", "score"), figs_dir,
              "score")),
        (f"KL(policy || reference) in {unit} {mean}; dotted: the target",
         save(_curves(by_arm, "kl", f"KL(policy || reference), {unit}", "nats", target=target),
              figs_dir, "kl")),
        (f"beta (log scale) {mean}",
         save(_curves(by_arm, "beta", "beta", "beta", log=True), figs_dir, "beta")),
        (f"held-out perplexity of the policy {mean}",
         save(_curves(by_arm, "held_out_perplexity", "held-out perplexity of the policy",
                      "perplexity", sparse=True), figs_dir, "perplexity")),
    ]


_HEAD = ("| arm | seeds | KL (2nd half) | abs(KL - target), seed mean | worst seed | "
         "score (2nd half) | final beta | held-out ppl | distinct-2 |")
_HOW = ("Second half: the iterations after the midpoint of each run. KL (2nd half): the seeds' "
        "mean of each seed's second-half mean KL; abs(KL - target): the seeds' mean of each "
        "seed's abs(second-half mean KL - target), the worst seed its largest.")


def _cells(s: ArmSummary) -> list[str]:
    return [s.arm, str(s.seeds), f"{s.kl_second_half:.2f}", f"{s.kl_abs_error_second_half:.2f}",
            f"{s.max_seed_abs_error:.2f}", f"{s.score_second_half:.3f}", f"{s.final_beta:.4g}",
            f"{s.final_perplexity:.1f}", f"{s.distinct_2:.3f}"]


def _summary_md(summaries: list[ArmSummary], common: int | None, machines: list[str]) -> str:
    md = [_HEAD, "|---" * 9 + "|", *("| " + " | ".join(_cells(s)) + " |" for s in summaries),
          "", _HOW]
    if common is not None:
        md.append(f"\nRuns stopped at different iterations: every run is read up to iteration "
                  f"{common}, the last that all of them reached.")
    if machines:
        md += ["", "Measured on (from the runs' metadata.json):", *(f"- {m}" for m in machines),
               "", "Float results differ across machines (CPU model, torch build, thread "
               "count): the same seed gives the same numbers on the same machine and software, "
               "not necessarily on another."]
    return "\n".join(md) + "\n"


def _samples_html(by_arm: dict[str, list[list[dict]]]) -> list[str]:
    e = html.escape
    parts = ["<h2>Sample texts (last evaluation, seed of the first run)</h2>"]
    for arm, runs in sorted(by_arm.items()):
        for r in [r for r in runs[0] if "samples" in r][-1:]:
            parts.append(f"<h3>{e(arm)} (episode {r['episodes']})</h3><ul>")
            parts += [f"<li><span class='muted'>{e(s['prompt'])}</span> <b>{e(s['response'])}"
                      f"</b> <span class='muted'>(score {s['score']:.2f})</span></li>"
                      for s in r["samples"]]
            parts.append("</ul>")
    return parts


def _first_config(compare_dir: Path) -> str | None:
    for d in sorted(p.name for p in (compare_dir / "runs").iterdir()):
        if (compare_dir / "runs" / d / "config.yaml").exists():
            text = (compare_dir / "runs" / d / "config.yaml").read_text()
            return yaml.safe_dump(yaml.safe_load(text))
    return None


def lm_report(compare_dir: str | Path, out_dir: str | Path) -> tuple[Path, list[ArmSummary]]:
    """The report of a comparison's runs (``COMPARE/runs/ARM__SEED``) in ``out_dir``:
    ``summary.md``, ``summary.json``, ``curves.csv`` (every number's data), ``report.html``
    and its figures."""
    compare_dir, out = Path(compare_dir), Path(out_dir)
    runs = _read_runs(compare_dir)
    by_arm = runs.by_arm
    common = _common_length(by_arm)
    first = next(iter(by_arm.values()))[0][0]
    unit, target = first["kl_unit"], first["kl_target"]
    figures = _figures(by_arm, out / "figures", unit, target)
    summaries = [summarize_arm(a, rs) for a, rs in sorted(by_arm.items())]
    (out / "summary.json").write_text(json.dumps([s.__dict__ for s in summaries], indent=2))
    _write_curves(runs, out / "curves.csv")
    md = _summary_md(summaries, common, runs.machines)
    (out / "summary.md").write_text(md)
    e = html.escape
    cut = "" if common is None else (f" Runs stopped at different iterations: every run is read "
                                     f"up to iteration {common}, the last that all of them "
                                     "reached.")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>klppo RLHF report"
             f"</title><style>{CSS}</style></head><body><h1>RLHF: fixed vs adaptive KL control"
             f"</h1><p class='muted'>KL unit: {e(unit)}; target {target:g}. {e(_HOW)}{e(cut)}"
             "</p>", *machines_html(runs.machines), "<table><tr>"
             + "".join(f"<th>{e(h.strip())}</th>" for h in _HEAD.strip("|").split("|"))
             + "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in _cells(s)) + "</tr>"
              for s in summaries]
    parts.append("</table><p class='muted'>The data: curves.csv beside this page.</p>"
                 "<h2>Curves</h2>")
    parts += [f"<figure>{img_tag(p)}<figcaption>{e(c)}</figcaption></figure>" for c, p in figures]
    parts += _samples_html(by_arm)
    if runs.skipped:
        parts.append("<h2>Skipped</h2><ul>" + "".join(
            f"<li>{e(n)}: {e(w)}</li>" for n, w in runs.skipped) + "</ul>")
    config = _first_config(compare_dir)
    if config is not None:
        parts.append(f"<h2>Configuration (first arm)</h2><pre>{e(config)}</pre>")
    parts.append("</body></html>")
    page = out / "report.html"
    page.write_text("\n".join(parts))
    return page, summaries
