"""Report figures (matplotlib, Agg): KL vs target with beta, partitions (learning curves:
:mod:`klppo.report.curves`).

Every figure takes ``smooth``: a trailing moving average over that many iterations (1: the raw
values; NaN entries are left out of each window), stated in its title. Legends sit outside the
axes, off the data.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from klppo.report.curves import learning_curves, smooth_values, window_text  # noqa: E402
from klppo.report.load import Run  # noqa: E402
from klppo.report.partition import kill_set_beta  # noqa: E402

__all__ = ["save", "smooth_values", "learning_curves", "kl_tracking", "has_target",
           "lr_anneals", "partitions", "TARGET_COLOUR"]

#: the target line's colour: a colour no data series uses
TARGET_COLOUR = "black"
_LEGEND = {"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
           "borderaxespad": 0.0}
#: tab10's colours (RGB); get_cmap is typed as the Colormap base class, without ``colors``
_SEED_COLOURS: tuple[tuple[float, float, float], ...] = (
    plt.get_cmap("tab10").colors)  # type: ignore[attr-defined]


def _f(x) -> float:
    return np.nan if x is None else float(x)


def _smoothed_note(smooth: int) -> str:
    return f" ({window_text(smooth)})"


def save(fig, out_dir: Path, name: str) -> Path:
    """Write ``name``.png and ``name``.svg; return the PNG path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=110, bbox_inches="tight")
    fig.savefig(out_dir / f"{name}.svg", bbox_inches="tight")
    plt.close(fig)
    return png


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
        lrs = [v for v in (m.get("lr") for m in r.metrics) if isinstance(v, (int, float))]
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
    hidden = sum(int(np.sum(y <= 0)) for _, y, _ in series) if log else 0
    if hidden:  # said on the panel: a gap must not read as a missing record
        total = sum(int(np.sum(np.isfinite(y))) for _, y, _ in series)
        axis.text(0.01, 0.03, f"{hidden} of {total} values <= 0: gaps on this log scale",
                  transform=axis.transAxes, fontsize=7, color="0.35")
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
    ax.set_title(f"{env} / {cond}: {what}, {kind}\n(KL: {window_text(smooth)}; beta: raw)",
                 fontsize=10)
    ax.legend(**_LEGEND)
    bx.set(ylabel="beta", yscale=beta_scale, xlabel="environment steps")
    for a in (ax, bx):
        a.grid(alpha=0.3)
    return fig


def partitions(env: str, cond: str, runs: list[Run], smooth: int = 1):
    """Kill and pass fractions (own scale), the in fraction, and |beta_t| over training; means
    over seeds.

    |beta_t| is 0 off the kill set, so its quantiles over all samples (what runs log) are 0
    whenever fewer than 50% (q50) or 10% (q90) of the samples are killed: the panel shows the
    mean |beta_t| on the kill set (:func:`kill_set_beta`) and the q99 over all samples, and
    q50 / q90 only where they are ever above 0 (the title says so where they are not)."""
    fig, (kx, ix, bx) = plt.subplots(1, 3, figsize=(10.5, 3.9))
    n = min(len(r.metrics) for r in runs)
    steps = [m["global_step"] for m in runs[0].metrics[:n]]

    def mean(values) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean([smooth_values(values(r)[:n], smooth) for r in runs], 0)

    def key_mean(key: str) -> np.ndarray:
        return mean(lambda r: [m.get(key) for m in r.metrics])

    for key, color in (("frac_kill", "tab:red"), ("frac_pass", "tab:orange")):
        kx.plot(steps, key_mean(key), label=key[5:], color=color)
    kx.set(title="kill and pass", xlabel="environment steps", ylabel="fraction of samples")
    kx.set_ylim(bottom=0)
    kx.legend(fontsize=9)
    ix.plot(steps, key_mean("frac_in"), color="tab:green")
    ix.set(title="in (clip inactive)", xlabel="environment steps")
    _beta_panel(bx, runs, steps, mean, key_mean)
    for a in (kx, ix, bx):
        a.grid(alpha=0.3)
        a.tick_params(labelsize=9)
        a.xaxis.get_offset_text().set_fontsize(9)
    fig.suptitle(f"{env} / {cond}: partition of samples (mean over {len(runs)} seed"
                 f"{'s' if len(runs) != 1 else ''}){_smoothed_note(smooth)}", fontsize=11)
    fig.tight_layout()
    return fig


def _beta_panel(bx, runs: list[Run], steps, mean, key_mean) -> None:
    """The |beta_t| panel of :func:`partitions`."""
    zero = []
    if all(any(kill_set_beta(m, r.config) is not None for m in r.metrics) for r in runs):
        bx.plot(steps, mean(lambda r: [kill_set_beta(m, r.config) for m in r.metrics]),
                color="tab:purple", label="mean on the kill set")
    for key, style in (("beta_t_q50", ":"), ("beta_t_q90", "-."), ("beta_t_q99", "--")):
        values = key_mean(key)
        if key != "beta_t_q99" and not np.nanmax(np.abs(values), initial=0.0) > 0:
            zero.append(key[-3:])
            continue
        bx.plot(steps, values, ls=style, color="0.3", label=f"{key[-3:]} over all samples")
    note = (f"\n{' and '.join(zero)} over all samples: 0 throughout\n(most samples are not "
            "killed)" if zero else "")
    bx.set_title("|beta_t| (0 off the kill set)")
    bx.set(xlabel="environment steps", ylabel="|beta_t|")
    bx.set_ylim(bottom=0)
    bx.legend(fontsize=9, title=note.strip() or None, title_fontsize=8, alignment="left")
