"""Report figures (matplotlib, Agg): learning curves, KL vs target with beta, partitions.

Every figure takes ``smooth``: a trailing moving average over that many iterations (1: the raw
values; NaN entries are left out of each window). Legends sit outside the axes, off the data.
"""

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

__all__ = ["save", "smooth_values", "learning_curves", "kl_tracking", "has_target",
           "lr_anneals", "partitions", "TARGET_COLOUR"]

#: the target line's colour: a colour no data series uses
TARGET_COLOUR = "black"
_LEGEND = {"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
           "borderaxespad": 0.0}
_SEED_COLOURS = plt.get_cmap("tab10").colors


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


def _smoothed_note(smooth: int) -> str:
    return f" (moving average over {smooth} iterations)" if smooth > 1 else ""


def save(fig, out_dir: Path, name: str) -> Path:
    """Write ``name``.png and ``name``.svg; return the PNG path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=110, bbox_inches="tight")
    fig.savefig(out_dir / f"{name}.svg", bbox_inches="tight")
    plt.close(fig)
    return png


def learning_curves(env: str, runs: list[Run], smooth: int = 1):
    """Mean training-episode return across seeds with a 95% band, one line per condition."""
    fig, ax = plt.subplots(figsize=(8, 4))
    by_cond: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_cond[r.condition].append(r)
    last = max(r.metrics[-1]["global_step"] for r in runs)
    grid = np.linspace(0, last, 200)
    styles = ["-", "--", ":", "-."]  # identical curves (Theorem 1) stay visible
    for k, (cond, rs) in enumerate(sorted(by_cond.items())):
        curves = np.stack([curve_on_grid(
            [m["global_step"] for m in r.metrics],
            list(smooth_values([m.get("episode_return_mean") for m in r.metrics], smooth)),
            grid) for r in rs])
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before episode 1
            mean = np.nanmean(curves, 0)
            n = np.sum(~np.isnan(curves), 0)
            sem = np.nanstd(curves, 0) / np.sqrt(np.maximum(n, 1))
        line, = ax.plot(grid, mean, ls=styles[k % len(styles)], label=f"{cond} (n={len(rs)})")
        ax.fill_between(grid, mean - 1.96 * sem, mean + 1.96 * sem, alpha=0.2,
                        color=line.get_color())
    ax.set(title=f"{env}: training-episode return{_smoothed_note(smooth)}",
           xlabel="environment steps", ylabel="episode return\n(mean over seeds, 95% band)")
    ax.legend(title="condition", title_fontsize=8, **_LEGEND)
    ax.grid(alpha=0.3)
    return fig


def has_target(runs: list[Run]) -> float | None:
    """The KL target the runs' controller steers to (None for a fixed beta: no target)."""
    for r in runs:
        if ((r.config.get("kl") or {}).get("controller", "fixed")) == "fixed":
            continue
        t = next((m.get("kl_target") for m in r.metrics if m.get("kl_target") is not None),
                 None)
        if t is not None:
            return float(t)
    return None


def lr_anneals(runs: list[Run]) -> bool:
    """True when the learning rate falls to (near) zero by the end of training: the logged
    ``lr`` ends below a tenth of its start, or (without ``lr``) ``ppo.anneal_lr`` is set."""
    for r in runs:
        lrs = [m.get("lr") for m in r.metrics if isinstance(m.get("lr"), (int, float))]
        if len(lrs) >= 2 and lrs[0] > 0:
            if lrs[-1] < 0.1 * lrs[0]:
                return True
        elif (r.config.get("ppo") or {}).get("anneal_lr"):
            return True
    return False


#: the note shown with a KL figure when the learning rate anneals
ANNEAL_NOTE = ("The learning rate anneals linearly to 0, so the KL between successive "
               "policies falls towards 0 at the end of training whatever beta is.")


def _positive(v: np.ndarray) -> np.ndarray:
    """A log axis cannot show values <= 0: they become gaps."""
    return np.where(v > 0, v, np.nan)


def _log_or_linear(axis, series: list[tuple[list, np.ndarray, dict]],
                   log: bool = True) -> str:
    """Plot ``(x, y, style)`` series for a log y axis when some value is > 0 (those <= 0 are
    gaps), else (a fixed beta of 0, a KL never above 0) for a linear one; the scale to set
    (once every panel is drawn: matplotlib warns when a shared axis is rescaled earlier)."""
    log = log and any(bool(np.any(y > 0)) for _, y, _ in series)
    for x, y, style in series:
        axis.plot(x, _positive(y) if log else y, **style)
    return "log" if log else "linear"


def kl_tracking(env: str, cond: str, runs: list[Run], smooth: int = 1):
    """One condition, seeds overlaid: the KL fed to the controller against its target (top,
    log scale; the target in its own colour; no target for a fixed beta) and beta (bottom,
    log scale). A panel with no value above 0 (beta fixed at 0) is on a linear scale. The
    caller says when the learning rate anneals (:data:`ANNEAL_NOTE`)."""
    target = has_target(runs)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 4.8), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 2]})
    kls, betas = [], []
    for i, r in enumerate(sorted(runs, key=lambda r: r.seed)):
        ms = r.metrics
        style = {"color": _SEED_COLOURS[i % len(_SEED_COLOURS)], "lw": 1.2, "alpha": 0.85,
                 "label": f"seed {r.seed}"}
        steps = [m["global_step"] for m in ms]
        kls.append((steps, smooth_values([m.get("kl_observed", m.get("kl_rollout"))
                                          for m in ms], smooth), style))
        betas.append((steps, np.array([_f(m.get("beta")) for m in ms]), style))
    kl_scale = _log_or_linear(ax, kls, log=target is None or target > 0)
    beta_scale = _log_or_linear(bx, betas)
    if target is not None:
        ax.axhline(target, color=TARGET_COLOUR, ls="--", lw=1.5, label=f"target {target:g}")
    ax.set(ylabel="KL (nats per sample)", yscale=kl_scale)
    what = "KL vs target" if target is not None else "KL"
    fixed = {(r.config.get("kl") or {}).get("beta") for r in runs}
    kind = "adaptive beta" if target is not None else "fixed beta" + (
        f" {fixed.pop():g}" if len(fixed) == 1 and isinstance(next(iter(fixed)), (int, float))
        else "")
    ax.set_title(f"{env} / {cond}: {what}, {kind}{_smoothed_note(smooth)}", fontsize=10)
    ax.legend(**_LEGEND)
    bx.set(ylabel="beta", yscale=beta_scale, xlabel="environment steps")
    for a in (ax, bx):
        a.grid(alpha=0.3)
    return fig


def partitions(env: str, cond: str, runs: list[Run], smooth: int = 1):
    """Kill and pass fractions (own scale), the in fraction, and beta_t quantiles over training;
    means over seeds."""
    fig, (kx, ix, bx) = plt.subplots(1, 3, figsize=(12, 3.2))
    n = min(len(r.metrics) for r in runs)
    steps = [m["global_step"] for m in runs[0].metrics[:n]]

    def mean(key: str) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean([smooth_values([m.get(key) for m in r.metrics[:n]], smooth)
                               for r in runs], 0)

    for key, color in (("frac_kill", "tab:red"), ("frac_pass", "tab:orange")):
        kx.plot(steps, mean(key), label=key[5:], color=color)
    kx.set(title="kill and pass", xlabel="environment steps", ylabel="fraction of samples")
    kx.set_ylim(bottom=0)
    kx.legend(fontsize=8)
    ix.plot(steps, mean("frac_in"), color="tab:green")
    ix.set(title="in (clip inactive)", xlabel="environment steps")
    for key in ("beta_t_q50", "beta_t_q90", "beta_t_q99"):
        bx.plot(steps, mean(key), label=key.replace("beta_t_", ""))
    bx.set(title="|beta_t| quantiles (0 off the kill set)", xlabel="environment steps",
           ylabel="|beta_t|")
    bx.legend(fontsize=8)
    for a in (kx, ix, bx):
        a.grid(alpha=0.3)
    fig.suptitle(f"{env} / {cond}: partition of samples (mean over {len(runs)} seed"
                 f"{'s' if len(runs) != 1 else ''}){_smoothed_note(smooth)}", fontsize=10)
    fig.tight_layout()
    return fig
