"""Report figures (matplotlib, Agg): learning curves, KL vs target with beta, partitions."""

from __future__ import annotations

import warnings
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from klppo.report.load import Run  # noqa: E402
from klppo.report.stats import curve_on_grid  # noqa: E402

__all__ = ["save", "learning_curves", "kl_tracking", "partitions"]


def _f(x) -> float:
    return np.nan if x is None else float(x)


def save(fig, out_dir: Path, name: str) -> Path:
    """Write ``name``.png and ``name``.svg; return the PNG path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=110, bbox_inches="tight")
    fig.savefig(out_dir / f"{name}.svg", bbox_inches="tight")
    plt.close(fig)
    return png


def learning_curves(env: str, runs: list[Run]):
    """Mean training-episode return across seeds with a 95% band, one line per condition."""
    fig, ax = plt.subplots(figsize=(7, 4))
    by_cond: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_cond[r.condition].append(r)
    last = max(r.metrics[-1]["global_step"] for r in runs)
    grid = np.linspace(0, last, 200)
    styles = ["-", "--", ":", "-."]  # identical curves (Theorem 1) stay visible
    for k, (cond, rs) in enumerate(sorted(by_cond.items())):
        curves = np.stack([curve_on_grid([m["global_step"] for m in r.metrics],
                                         [m.get("episode_return_mean") for m in r.metrics],
                                         grid) for r in rs])
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before episode 1
            mean = np.nanmean(curves, 0)
            n = np.sum(~np.isnan(curves), 0)
            sem = np.nanstd(curves, 0) / np.sqrt(np.maximum(n, 1))
        line, = ax.plot(grid, mean, ls=styles[k % len(styles)], label=f"{cond} (n={len(rs)})")
        ax.fill_between(grid, mean - 1.96 * sem, mean + 1.96 * sem, alpha=0.2,
                        color=line.get_color())
    ax.set(title=f"{env}: training-episode return", xlabel="environment steps",
           ylabel="episode return (mean over seeds, 95% band)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def kl_tracking(env: str, run: Run):
    """KL fed to the controller against its target, with beta on a second axis."""
    ms = run.metrics
    steps = [m["global_step"] for m in ms]
    kl = [m.get("kl_observed", m.get("kl_rollout")) for m in ms]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(steps, kl, color="tab:blue", label="observed KL (nats per sample)")
    target = next((m.get("kl_target") for m in ms if m.get("kl_target") is not None), None)
    if target is not None:
        ax.axhline(target, color="tab:blue", ls="--", lw=1, label=f"target {target:g}")
    ax.set(xlabel="environment steps", ylabel="KL", yscale="log")
    ax2 = ax.twinx()
    ax2.plot(steps, [m.get("beta") for m in ms], color="tab:red", label="beta")
    ax2.set(ylabel="beta", yscale="log")
    ax.set_title(f"{env} / {run.condition} / seed {run.seed}: KL vs target, beta")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper right")
    return fig


def partitions(env: str, cond: str, runs: list[Run]):
    """Kill / pass / in fractions (mean over seeds) and beta_t quantiles over training."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.2))
    steps = [m["global_step"] for m in runs[0].metrics]
    n = min(len(r.metrics) for r in runs)
    for key, color in (("frac_kill", "tab:red"), ("frac_pass", "tab:orange"),
                       ("frac_in", "tab:green")):
        vals = np.nanmean([[_f(m.get(key)) for m in r.metrics[:n]] for r in runs], 0)
        ax.plot(steps[:n], vals, label=key[5:], color=color)
    ax.set(title=f"{env} / {cond}: partition", xlabel="environment steps",
           ylabel="fraction of samples")
    ax.legend(fontsize=8)
    for key in ("beta_t_q50", "beta_t_q90", "beta_t_q99"):
        vals = np.nanmean([[_f(m.get(key)) for m in r.metrics[:n]] for r in runs], 0)
        bx.plot(steps[:n], vals, label=key.replace("beta_t_", "|beta_t| "))
    bx.set(title="beta_t quantiles", xlabel="environment steps", ylabel="|beta_t|")
    bx.legend(fontsize=8)
    for a in (ax, bx):
        a.grid(alpha=0.3)
    return fig
