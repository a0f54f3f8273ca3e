"""Plots of the controller lab (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_lab(steps: Sequence[float], kl_by_label: dict[str, Sequence[float]],
             beta_by_label: dict[str, Sequence[float]], target: float | None, title: str,
             path: Path) -> Path:
    """KL (top, log scale, with the target) and beta (bottom, log scale) per controller."""
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for label, kl in kl_by_label.items():
        ax.plot(steps, kl, lw=1, label=label)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g}")
    ax.set(ylabel="KL (nats per sample)", yscale="log", title=title)
    ax.legend(fontsize=7, ncol=2)
    for label, beta in beta_by_label.items():
        bx.plot(steps, beta, lw=1, label=label)
    bx.set(ylabel="beta", yscale="log", xlabel="update")
    for a in (ax, bx):
        a.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
