"""One colour per condition, in every figure of a report and in every report of a sweep.

klppo's own condition names (the demo's and the paper's four, the objectives) keep one colour
everywhere; any other name gets a colour from its name (a stable hash), moved to the next free
colour of the palette when two names of one figure would share it. So the same set of
conditions is drawn in the same colours in every figure and every report, whatever order the
runs were found in.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["PALETTE", "FIXED", "condition_colours"]

#: tab10's colours (RGB); get_cmap is typed as the Colormap base class, without ``colors``
PALETTE: tuple[tuple[float, float, float], ...] = (
    plt.get_cmap("tab10").colors)  # type: ignore[attr-defined]
#: condition name -> its index in :data:`PALETTE`, the same in every report
FIXED = {"clip": 0, "kl_adaptive": 1, "kl_fixed": 2, "per_sample_kl": 3, "kl_penalty": 4,
         "fixed_strong": 2, "adaptive_from_strong": 1, "fixed_weak": 5, "adaptive_from_weak": 9}


def condition_colours(names: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    """``name -> colour`` for a figure's conditions (see the module docstring)."""
    unique = sorted(set(names))
    out: dict[str, tuple[float, float, float]] = {}
    taken: set[int] = set()
    for name in (n for n in unique if n in FIXED):
        out[name] = PALETTE[FIXED[name]]
        taken.add(FIXED[name])
    for name in (n for n in unique if n not in FIXED):
        start = zlib.crc32(name.encode()) % len(PALETTE)
        free = [(start + k) % len(PALETTE) for k in range(len(PALETTE))
                if (start + k) % len(PALETTE) not in taken]
        slot = free[0] if free else start  # more names than colours: they repeat
        out[name] = PALETTE[slot]
        taken.add(slot)
    return out
