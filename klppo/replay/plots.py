"""Plots of the controller lab (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["lab_figure", "plot_lab"]

_OUTSIDE = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
            "borderaxespad": 0.0}


def _scale(series) -> str:
    """A log axis where some value is > 0 (those <= 0 are left out), else linear."""
    return "log" if any(v > 0 for vs in series for v in vs) else "linear"


def lab_figure(steps: Sequence[float], kl_by_label: dict[str, Sequence[float]],
               beta_by_label: dict[str, Sequence[float]], target: float | None, title: str,
               xlabel: str = "update"):
    """KL (top, log scale, with the target) and beta (bottom, log scale) per controller (a
    panel with no value above 0, a fixed beta of 0, is linear); each panel has its legend to
    the right of the data; ``xlabel`` says what the x axis counts.

    When ``kl_by_label`` has the controllers' labels (closed loop), a controller's KL line has
    its beta line's colour and the top legend shows the target only."""
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {label: colours[i % len(colours)] for i, label in enumerate(beta_by_label)}
    same = set(kl_by_label) == set(beta_by_label)
    for label, kl in kl_by_label.items():
        if same:
            ax.plot(steps, kl, lw=1, color=colour[label])
        else:
            ax.plot(steps, kl, lw=1, color="0.35", label=f"{label} (observed KL)")
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g}")
    ax.set(ylabel="KL (nats per sample)", yscale=_scale(kl_by_label.values()), title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="KL: colours as below" if same else None, title_fontsize=7, **_OUTSIDE)
    for label, beta in beta_by_label.items():
        bx.plot(steps, beta, lw=1, color=colour[label], label=label)
    bx.set(ylabel="beta", yscale=_scale(beta_by_label.values()), xlabel=xlabel)
    bx.legend(title="controller", title_fontsize=7, **_OUTSIDE)
    for a in (ax, bx):
        a.grid(alpha=0.3)
    return fig


def plot_lab(steps: Sequence[float], kl_by_label: dict[str, Sequence[float]],
             beta_by_label: dict[str, Sequence[float]], target: float | None, title: str,
             path: Path, xlabel: str = "update") -> Path:
    """:func:`lab_figure` written to ``path`` (PNG); returns ``path``."""
    fig = lab_figure(steps, kl_by_label, beta_by_label, target, title, xlabel)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
