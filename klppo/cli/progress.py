"""What the long-running sub-commands print while they work: elapsed time and ETA, the
numeric warnings of a run folded into one line, and klppo's own warnings as one line each."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

__all__ = ["NumericWarnings", "one_line_warnings", "clock", "elapsed_eta"]


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Inside it, a warning of one of klppo's own classes (e.g.
    :class:`klppo.core.kl_gradient_claims.KLGradientWarning`) prints as one line on stderr,
    ``WARNING <class>: <message>``, like the log lines; other warnings as usual. Python's
    filters still decide whether a warning shows (by default once per place and message)."""
    show = warnings.showwarning

    def one_line(message, category, filename, lineno, file=None, line=None):
        if category.__module__.startswith("klppo."):
            print(f"WARNING {category.__name__}: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = one_line
    try:
        yield
    finally:
        warnings.showwarning = show


class NumericWarnings(list):
    """Inside ``with NumericWarnings() as w``, numeric RuntimeWarnings (numpy's overflow, invalid
    value, ...) are collected instead of printed, once per message; :meth:`suffix` folds them
    into a command's one line. Other warnings are shown as usual."""

    def __enter__(self) -> NumericWarnings:
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        show = warnings.showwarning

        def collect(message, category, *args, **kwargs):
            if issubclass(category, RuntimeWarning):
                if str(message) not in self:
                    self.append(str(message))
            else:
                show(message, category, *args, **kwargs)

        warnings.showwarning = collect
        return self

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)

    def suffix(self) -> str:
        return f" (numeric warnings: {'; '.join(self[:3])})" if self else ""


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on)."""
    s = int(max(0.0, seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def elapsed_eta(elapsed: float, done: int, left: int) -> str:
    """``"0:10 elapsed, ETA 0:30"``: ``done`` units took ``elapsed`` s; ``left`` remain."""
    eta = clock(elapsed / done * left) if done > 0 else "-"
    return f"{clock(elapsed)} elapsed, ETA {eta}"
