"""Plots of the controller lab (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["lab_figure", "closed_loop_figure", "plot_lab", "beta_scale", "DECADES", "SMOOTH"]

_OUTSIDE = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
            "borderaxespad": 0.0}
_TARGET_STYLES = ["--", ":", "-."]

#: the beta axis is logarithmic over this many decades below the largest beta; below that
#: (a step rule halving beta on every update of an annealed run reaches 1e-20, a PID beta
#: sits at 0) it is linear, so every controller stays on the axis
DECADES = 4


def _scale(series) -> str:
    """A log axis where some value is > 0 (those <= 0 are left out), else linear."""
    return "log" if any(v > 0 for vs in series for v in vs) else "linear"


def beta_scale(series) -> tuple[str, float | None]:
    """``(scale, linthresh)`` of the beta axis: ``"log"`` when every value lies within
    :data:`DECADES` decades of the largest; ``"symlog"`` with ``linthresh`` that far below it
    when some value is smaller (or 0), so it stays visible near the bottom instead of
    stretching the axis over 20 decades or dropping off it; ``"linear"`` with no value > 0."""
    values = np.concatenate([np.asarray(v, float) for v in series]) if series else np.zeros(0)
    values = values[np.isfinite(values)]
    if not (values > 0).any():
        return "linear", None
    floor = float(values.max()) * 10.0 ** -DECADES
    if values.min() >= floor:
        return "log", None
    return "symlog", floor


def _targets(ax, targets: dict[str, float | None]) -> None:
    """One dashed line per distinct target, naming its controllers when they differ."""
    by_value: dict[float, list[str]] = {}
    for label, t in targets.items():
        if t is not None:
            by_value.setdefault(t, []).append(label)
    for i, (t, labels) in enumerate(sorted(by_value.items())):
        who = f" ({', '.join(labels)})" if len(by_value) > 1 else ""
        ax.axhline(t, color="k", ls=_TARGET_STYLES[i % len(_TARGET_STYLES)], lw=1,
                   label=f"target {t:g}{who}")


def lab_figure(steps: Sequence[float], kl_by_label: dict[str, Sequence[float]],
               beta_by_label: dict[str, Sequence[float]], target: float | None, title: str,
               xlabel: str = "update", targets: dict[str, float | None] | None = None):
    """KL (top, log scale, with the target) and beta (bottom, :func:`beta_scale`) per
    controller (a panel with no value above 0, a fixed beta of 0, is linear); each panel has
    its legend to the right of the data; ``xlabel`` says what the x axis counts.

    ``targets`` (controller -> its own target) draws one line per distinct target, naming the
    controllers when they differ (a step preset keeps its own); without it, ``target``.
    When ``kl_by_label`` has the controllers' labels (closed loop) and there are several, each
    controller gets a row of its own (:func:`closed_loop_figure`)."""
    if set(kl_by_label) == set(beta_by_label) and len(beta_by_label) > 1:
        return closed_loop_figure(steps, kl_by_label, beta_by_label, title, xlabel,
                                  targets if targets is not None else
                                  dict.fromkeys(beta_by_label, target))
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {label: colours[i % len(colours)] for i, label in enumerate(beta_by_label)}
    same = set(kl_by_label) == set(beta_by_label)
    for label, kl in kl_by_label.items():
        if same:
            ax.plot(steps, kl, lw=1, color=colour[label])
        else:
            ax.plot(steps, kl, lw=1, color="0.35", label=f"{label} (observed KL)")
    _targets(ax, targets if targets is not None else {"": target})
    ax.set(ylabel="KL (nats per sample)", yscale=_scale(kl_by_label.values()), title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="KL: colours as below" if same else None, title_fontsize=7, **_OUTSIDE)
    for label, beta in beta_by_label.items():
        bx.plot(steps, beta, lw=1, color=colour[label], label=label)
    scale, floor = beta_scale(list(beta_by_label.values()))
    if scale == "symlog":
        _set_beta_axis(bx, scale, floor)
        bx.set_ylabel(f"beta\n(log; linear below {floor:.0e})")
    else:
        bx.set(ylabel="beta", yscale=scale)
    bx.set_xlabel(xlabel)
    bx.legend(title="controller", title_fontsize=7, **_OUTSIDE)
    for a in (ax, bx):
        a.grid(alpha=0.3)
    return fig


#: the trailing window (updates) of the thick KL line of :func:`closed_loop_figure`
SMOOTH = 10


def _trailing_mean(values: Sequence[float], window: int) -> np.ndarray:
    x = np.asarray(values, float)
    c = np.concatenate([[0.0], np.cumsum(x)])
    n = np.minimum(np.arange(1, len(x) + 1), window)
    return (c[1:] - c[np.arange(1, len(x) + 1) - n]) / n


def _set_beta_axis(bx, scale: str, floor: float | None) -> None:
    if scale == "symlog":
        bx.set_yscale("symlog", linthresh=floor, linscale=0.4)
        bx.axhspan(0, floor, color="0.93", zorder=0)
        bx.set_ylim(bottom=0)
    else:
        bx.set_yscale(scale)


def closed_loop_figure(steps: Sequence[float], kl_by_label: dict[str, Sequence[float]],
                       beta_by_label: dict[str, Sequence[float]], title: str, xlabel: str,
                       targets: dict[str, float | None]):
    """One row per controller, the same axes in every row: its KL (left: each update thin,
    the trailing mean over :data:`SMOOTH` updates thick, its target dashed) and its beta
    (right), so six controllers on one noisy plant read as six small plots, not one tangle."""
    labels = list(beta_by_label)
    fig, axes = plt.subplots(len(labels), 2, figsize=(10, 1.6 * len(labels) + 1.0),
                             sharex=True, sharey="col", squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    scale, floor = beta_scale(list(beta_by_label.values()))
    for i, label in enumerate(labels):
        ax, bx, c = axes[i, 0], axes[i, 1], colours[i % len(colours)]
        ax.plot(steps, kl_by_label[label], lw=0.6, color=c, alpha=0.45)
        ax.plot(steps, _trailing_mean(kl_by_label[label], SMOOTH), lw=1.6, color=c)
        if targets.get(label) is not None:
            ax.axhline(targets[label], color="k", ls="--", lw=1)
        ax.set_yscale(_scale(kl_by_label.values()))
        ax.set_title(label, fontsize=8, loc="left")
        bx.plot(steps, beta_by_label[label], lw=1.2, color=c)
        _set_beta_axis(bx, scale, floor)
        for a in (ax, bx):
            a.grid(alpha=0.3)
            a.tick_params(labelsize=8)
    beta = "beta" + (f" (log; linear below {floor:.0e}, shaded)" if floor else "")
    fig.suptitle(f"{title}\nleft: KL (nats per sample), thin each update, thick the trailing "
                 f"mean over {SMOOTH}, dashed the target; right: {beta}", fontsize=9)
    for a in axes[-1]:
        a.set_xlabel(xlabel, fontsize=8)
    fig.tight_layout()
    return fig


def plot_lab(steps: Sequence[float], kl_by_label: dict[str, Sequence[float]],
             beta_by_label: dict[str, Sequence[float]], target: float | None, title: str,
             path: Path, xlabel: str = "update",
             targets: dict[str, float | None] | None = None) -> Path:
    """:func:`lab_figure` written to ``path`` (PNG); returns ``path``."""
    fig = lab_figure(steps, kl_by_label, beta_by_label, target, title, xlabel, targets)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
