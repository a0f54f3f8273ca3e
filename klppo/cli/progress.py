"""What the long-running sub-commands print while they work, on one library (rich).

On a terminal, :class:`Bar` draws a live progress line fitted to the terminal's width: the
fields a command gives it, in priority order, shortened and then dropped from the least
important up (so at 80 columns ``klppo train`` keeps kill, beta, steps/s and the ETA). Lines
that are printed while the bar is live (a warning, Ctrl-C's message) appear on their own line
above it. Elsewhere (a pipe, a log file) it prints plain lines: every ``every`` units and the
first and the last. The ETA is measured from the first unit that finished in this process
(the time before it, imports, loading a model or training a tokenizer, is not a rate).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, Self

__all__ = ["NumericWarnings", "one_line_warnings", "clock", "Part", "layout", "Eta", "Bar",
           "StderrHandler", "Closes", "quiet_hf_progress", "no_tqdm_bars"]


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Inside it, a warning of one of klppo's own classes (e.g.
    :class:`klppo.core.kl_gradient_claims.KLGradientWarning`) prints as one line on the stderr
    of the moment (above a live bar), ``WARNING <class>: <message>``, like the log lines; other
    warnings as usual. Python's filters still decide whether a warning shows (by default once
    per place and message)."""
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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._cm.__exit__(exc_type, exc, tb)

    def suffix(self) -> str:
        return f" (numeric warnings: {'; '.join(self[:3])})" if self else ""


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on)."""
    s = int(max(0.0, seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


@dataclass(frozen=True)
class Part:
    """One field of a progress line: its texts from the longest to the shortest form, its
    priority (a higher one is kept longer when the line does not fit) and the priority at
    which it takes a shorter form (``shorten``; its priority when not given)."""

    forms: tuple[str, ...]
    priority: int
    shorten: int | None = None

    @classmethod
    def of(cls, priority: int, *forms: str, shorten: int | None = None) -> Part:
        return cls(tuple(forms), priority, shorten)

    def rank(self, form: int) -> int:
        """The priority of this part's next step (shortening, or dropping at the last form)."""
        last = form + 1 >= len(self.forms)
        return self.priority if last or self.shorten is None else self.shorten


#: separators tried in turn before a field is shortened or dropped
_SEPARATORS = ("  ", " ")


def layout(parts: Sequence[Part], width: int, bar_priority: int | None = None,
           bar_min: int = 8, bar_max: int = 30) -> tuple[int, str]:
    """The bar's width (0: no bar) and the text of the fields that fit in ``width`` columns.

    While the line is too wide, the least important item (a field or the bar; among equals
    the rightmost) is shortened to its next form, or dropped when it has none left; a bar
    needs ``bar_min`` columns and one before the text, and takes what is left up to
    ``bar_max``."""
    form: list[int | None] = [0] * len(parts)
    bar = bar_priority is not None
    while True:
        for sep in _SEPARATORS:
            text = sep.join(p.forms[i] for p, i in zip(parts, form) if i is not None)
            if len(text) + (bar_min + 1 if bar else 0) <= width:
                return (min(bar_max, width - len(text) - 1) if bar else 0), text
        alive = [(p.rank(i), -k) for k, (p, i) in enumerate(zip(parts, form)) if i is not None]
        if bar and bar_priority is not None:
            alive.append((bar_priority, 1))  # the bar outlasts a field of its priority
        if not alive:
            return 0, ""
        _, k = min(alive)
        if k == 1 and bar:
            bar = False
            continue
        k = -k
        step = form[k]
        assert step is not None
        form[k] = step + 1 if step + 1 < len(parts[k].forms) else None


class Eta:
    """Elapsed time since the command started and the time left, from the rate of the units
    done since the first one finished (None before a second one has); ``from_first`` False:
    from the rate since the start (units that run in parallel, such as a sweep's runs)."""

    def __init__(self, total: int, now: Callable[[], float] = time.perf_counter,
                 from_first: bool = True, wave: int = 1) -> None:
        self.total, self._now, self.from_first = total, now, from_first
        #: units that start together (a sweep's first groups): they tend to end together too,
        #: so no ETA is given before as many have ended (one of a burst says nothing of the rest)
        self.wave = max(1, wave)
        self.start = now()
        self.first: tuple[int, float] | None = None  # (units done, time) at the first update
        self.done, self.at = 0, self.start

    def update(self, done: int) -> None:
        self.done, self.at = done, self._now()
        if self.first is None:
            self.first = (done, self.at)

    @property
    def elapsed(self) -> float:
        return self.at - self.start

    @property
    def left(self) -> float | None:
        if self.first is None or self.done < min(self.wave, self.total):
            return None
        d0, t0 = self.first if self.from_first else (self.first[0] - 1, self.start)
        if self.done <= d0:
            return None
        return (self.at - t0) / (self.done - d0) * max(0, self.total - self.done)

    def parts(self, elapsed: int = 1, eta: int = 9) -> list[Part]:
        """``elapsed 0:10`` and ``ETA 0:30`` (``ETA -`` while unknown), with these priorities."""
        left = self.left
        return [Part.of(elapsed, f"elapsed {clock(self.elapsed)}"),
                Part.of(eta, f"ETA {'-' if left is None else clock(left)}")]


class Closes:
    """A display that ``with`` closes: ``__exit__`` calls :meth:`close`."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Bar(Closes):
    """A progress bar over ``total`` units on a terminal, plain lines elsewhere.

    ``update(done, parts)`` after each unit; ``print(text)`` for a line of its own (above the
    bar on a terminal); ``close()`` (or the ``with`` block's end) leaves the last bar on the
    screen and the cursor on a new line. ``every``: a plain line every this many units (and
    the first and the last); ``bar_priority``: where the bar ranks among the fields;
    ``eta_from_first``: see :class:`Eta`."""

    def __init__(self, total: int, every: int | None = None, lines: int = 20,
                 bar_priority: int = 3, file: IO[str] | None = None,
                 now: Callable[[], float] = time.perf_counter,
                 eta_from_first: bool = True, wave: int = 1) -> None:
        from rich.console import Console

        self.total = max(1, total)
        self.file = file if file is not None else sys.stdout
        self.console = Console(file=self.file, highlight=False, soft_wrap=False)
        self.every = every if every is not None else max(1, self.total // lines)
        self.bar_priority = bar_priority
        self.eta = Eta(self.total, now, eta_from_first, wave)
        self._live: Any = None

    @property
    def tty(self) -> bool:
        return self.console.is_terminal

    def update(self, done: int, parts: Sequence[Part]) -> None:
        first = self.eta.first is None
        self.eta.update(done)
        every = [*parts, *self.eta.parts()]
        if self.tty:
            self._draw(done, every)
            if done >= self.total:
                self.close()
        elif first or done % self.every == 0 or done >= self.total:
            self.print("  ".join(p.forms[0] for p in every))

    def _draw(self, done: int, parts: list[Part]) -> None:
        from rich.live import Live
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        bar_w, text = layout(parts, self.console.width - 1, self.bar_priority)
        grid = Table.grid(padding=(0, 1) if bar_w else 0)
        row: list[Any] = [Text(text, no_wrap=True, overflow="crop")]
        if bar_w:
            row.insert(0, ProgressBar(total=self.total, completed=done, width=bar_w))
        grid.add_row(*row)
        if self._live is None:
            self._live = Live(grid, console=self.console, auto_refresh=False,
                              vertical_overflow="crop")
            self._live.start(refresh=True)
        else:
            self._live.update(grid, refresh=True)

    def print(self, text: str) -> None:
        """A line of its own (above the live bar on a terminal)."""
        if self._live is not None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.file.write(text + "\n")
            self.file.flush()

    def close(self) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()

class StderrHandler(logging.StreamHandler):
    """A logging handler that writes to the ``sys.stderr`` of the moment (a live bar redirects
    it so that a warning prints on its own line above the bar)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:  # logging sets it; the current stderr is used
        pass


def no_tqdm_bars() -> None:
    """No tqdm bars (transformers' GGUF loader uses plain tqdm) beside klppo's own: tqdm reads
    ``TQDM_DISABLE`` when it is imported (by torch), so this runs first; a user's value wins,
    and worker processes inherit it."""
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")


def quiet_hf_progress() -> None:
    """No progress bars of transformers / huggingface_hub (tqdm) next to klppo's own."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
