"""The RLHF comparison report: reward, KL against its target, beta and held-out perplexity per
arm, the second-half summary table, and sample texts. Reads run directories only (no torch)."""

from __future__ import annotations

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
from klppo.report.html import CSS, img_tag  # noqa: E402
from klppo.runs.metrics import read_metrics  # noqa: E402

__all__ = ["ArmSummary", "lm_report", "summarize_arm"]


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


def lm_report(compare_dir: str | Path, out_dir: str | Path) -> tuple[Path, list[ArmSummary]]:
    compare_dir, out = Path(compare_dir), Path(out_dir)
    figs_dir = out / "figures"
    by_arm: dict[str, list[list[dict]]] = defaultdict(list)
    skipped = []
    for d in sorted((compare_dir / "runs").iterdir()):
        if not (d / "metrics.jsonl").exists():
            skipped.append((d.name, "no metrics.jsonl"))
            continue
        recs, _ = read_metrics(d / "metrics.jsonl")
        if not recs:
            skipped.append((d.name, "no complete record"))
            continue
        by_arm[d.name.rsplit("__", 1)[0]].append(recs)
    if not by_arm:
        raise FileNotFoundError(f"{compare_dir}: no RLHF run with metrics")
    common = _common_length(by_arm)
    unit = next(iter(by_arm.values()))[0][0]["kl_unit"]
    target = next(iter(by_arm.values()))[0][0]["kl_target"]
    mean = "per arm, mean over seeds"
    figures = [
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
    summaries = [summarize_arm(a, rs) for a, rs in sorted(by_arm.items())]
    (out / "summary.json").write_text(json.dumps([s.__dict__ for s in summaries], indent=2))
    md = ["| arm | seeds | KL (2nd half) | abs(KL - target) | worst seed | score (2nd half) | "
          "final beta | held-out ppl | distinct-2 |", "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {s.arm} | {s.seeds} | {s.kl_second_half:.2f} | {s.kl_abs_error_second_half:.2f}"
           f" | {s.max_seed_abs_error:.2f} | {s.score_second_half:.3f} | {s.final_beta:.4g} | "
           f"{s.final_perplexity:.1f} | {s.distinct_2:.3f} |" for s in summaries]
    if common is not None:
        md.append(f"\nRuns stopped at different iterations: every run is read up to iteration "
                  f"{common}, the last that all of them reached.")
    (out / "summary.md").write_text("\n".join(md) + "\n")
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>klppo RLHF report"
             f"</title><style>{CSS}</style></head><body><h1>RLHF: fixed vs adaptive KL control"
             f"</h1><p class='muted'>KL unit: {e(unit)}; target {target:g}. Second half = "
             "iterations after the midpoint, averaged over seeds."
             + ("" if common is None else f" {e(md[-1].strip())}") + "</p><table><tr>"
             + "".join(f"<th>{e(h.strip())}</th>" for h in md[0].strip('|').split('|'))
             + "</tr>"]
    for s in summaries:
        parts.append(f"<tr><td>{e(s.arm)}</td><td>{s.seeds}</td><td>{s.kl_second_half:.2f}</td>"
                     f"<td>{s.kl_abs_error_second_half:.2f}</td><td>{s.max_seed_abs_error:.2f}"
                     f"</td><td>{s.score_second_half:.3f}</td><td>{s.final_beta:.4g}</td>"
                     f"<td>{s.final_perplexity:.1f}</td><td>{s.distinct_2:.3f}</td></tr>")
    parts.append("</table><h2>Curves</h2>")
    parts += [f"<figure>{img_tag(p)}<figcaption>{e(c)}</figcaption></figure>" for c, p in figures]
    parts.append("<h2>Sample texts (last evaluation, seed of the first run)</h2>")
    for arm, runs in sorted(by_arm.items()):
        last = [r for r in runs[0] if "samples" in r][-1:]
        for r in last:
            parts.append(f"<h3>{e(arm)} (episode {r['episodes']})</h3><ul>")
            parts += [f"<li><span class='muted'>{e(s['prompt'])}</span> <b>{e(s['response'])}"
                      f"</b> <span class='muted'>(score {s['score']:.2f})</span></li>"
                      for s in r["samples"]]
            parts.append("</ul>")
    if skipped:
        parts.append("<h2>Skipped</h2><ul>" + "".join(
            f"<li>{e(n)}: {e(w)}</li>" for n, w in skipped) + "</ul>")
    cfgs = [yaml.safe_dump(yaml.safe_load((compare_dir / "runs" / d / "config.yaml").read_text()))
            for d in sorted(p.name for p in (compare_dir / "runs").iterdir())
            if (compare_dir / "runs" / d / "config.yaml").exists()][:1]
    if cfgs:
        parts.append(f"<h2>Configuration (first arm)</h2><pre>{e(cfgs[0])}</pre>")
    parts.append("</body></html>")
    page = out / "report.html"
    page.write_text("\n".join(parts))
    return page, summaries
