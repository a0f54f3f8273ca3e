"""Ranges of config fields as dataclass field metadata, checked by one function for every klppo
config (training, RLHF, pretraining).

A field declares its range where it is defined::

    lr: float = field(default=3e-4, metadata=above(0))        # finite and > 0
    gamma: float = field(default=0.99, metadata=within(0, 1))  # in [0, 1]
    update_epochs: int = field(default=10, metadata=at_least(1))

and :func:`check_ranges` walks a config (nested dataclasses too) and raises a
:class:`~klppo.runs.errors.ConfigError` naming the first field out of its range and its value.
``None`` passes (an optional field that is unset); a field's type is checked elsewhere
(:mod:`klppo.runs.typecheck`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from klppo.runs.errors import ConfigError
from klppo.runs.typecheck import short_repr

__all__ = ["Range", "above", "at_least", "within", "below", "check_ranges"]


@dataclass(frozen=True)
class Range:
    """``low < x`` (``low_open``) or ``low <= x``, and ``x <= high`` (or ``x < high``); a
    float must also be finite. ``text`` says it in the error message."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    text: str = ""
    integer: bool = False

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


def _meta(r: Range) -> dict[str, Range]:
    return {"range": r}


def above(low: float) -> dict[str, Range]:
    """Finite and ``> low``."""
    return _meta(Range(low, low_open=True, text=f"must be finite and > {low:g}"))


def at_least(low: float, integer: bool = True, text: str = "") -> dict[str, Range]:
    """``>= low`` (an integer count, or a finite float)."""
    what = "an integer" if integer else "finite and"
    return _meta(Range(low, text=text or f"must be {what} >= {low:g}", integer=integer))


def within(low: float, high: float) -> dict[str, Range]:
    """In ``[low, high]``."""
    return _meta(Range(low, high, text=f"must be in [{low:g}, {high:g}]"))


def below(high: float, low: float = 0, text: str = "") -> dict[str, Range]:
    """An integer in ``[low, high)``."""
    return _meta(Range(low, high, high_open=True, integer=True,
                       text=text or f"must be an integer in [{low:g}, {high:g})"))


def check_ranges(cfg: Any, prefix: str = "") -> None:
    """ConfigError ``{prefix}{field}={value}: {why}`` for the first field of ``cfg`` (and of
    the dataclasses it holds) outside the range in its metadata."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_ranges(value, f"{prefix}{f.name}.")
            continue
        r = f.metadata.get("range")
        if r is None or value is None:
            continue
        if not r.holds(value):
            unset = " (or unset)" if f.default is None else ""
            raise ConfigError(f"{prefix}{f.name}={short_repr(value)}: {r.text}{unset}")
