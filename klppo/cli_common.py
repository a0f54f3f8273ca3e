"""What every ``klppo`` sub-command shares: one-line errors and flag parsing.

Bad input prints one line ``klppo <command>: <field>=<value>: <why>`` on stderr and exits 2; a
run that fails exits 1. No traceback reaches the user (status.json keeps the details).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings
from typing import Any, NoReturn, TypeVar

__all__ = ["BAD_INPUT", "FAILED", "MAX_LINE", "OneLineParser", "FlagError", "parse_config_flags",
           "one_line", "say_error", "clock", "elapsed_eta"]

T = TypeVar("T")

#: exit status of bad input (before any work starts) and of a run that failed
BAD_INPUT, FAILED = 2, 1
#: the longest error line printed (values in messages are cut to a short repr already; this
#: bounds whatever else a message quotes)
MAX_LINE = 300


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (``prog: message``), without the usage."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(BAD_INPUT)


class FlagError(ValueError):
    """A command-line flag tyro could not parse; the message is tyro's, on one line."""


def one_line(err: BaseException | str) -> str:
    """An error message on one line (continuation lines joined by ' ')."""
    text = str(err) or type(err).__name__
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def say_error(command: str, err: BaseException | str) -> None:
    """``klppo COMMAND: message`` on stderr, on one line of at most :data:`MAX_LINE` chars."""
    line = f"klppo {command}: {one_line(err)}"
    print(line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "...", file=sys.stderr)


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


def _tyro_error(text: str) -> str:
    """The gist of tyro's boxed error message, on one line (``title: message``)."""
    keep = []
    for line in text.splitlines():
        line = line.strip(" │╭╮╰╯─━┃┏┓┗┛|").strip()
        if set(line) <= {"-"}:  # a separator rule
            continue
        if line.startswith("Argument helptext"):
            break
        if line and not line.startswith(("For full helptext", "Parsing error", "Usage")):
            keep.append(line)
    if not keep:
        return "invalid flags (see --help)"
    title, body = keep[0], " ".join(keep[1:])
    return (body if body.lower().startswith(title.lower()) or not body
            else f"{title}: {body}")[:400] or title


def parse_config_flags(cls: type[T], args: list[str], prog: str, default: T | None = None,
                       description: str | None = None) -> T:
    """tyro's flags for the dataclass ``cls`` over ``default``; :class:`FlagError` (one line)
    when they do not parse. ``--help`` prints tyro's help and exits 0 as usual."""
    import tyro

    kw: dict[str, Any] = {"args": args, "prog": prog, "default": default,
                          "description": description}
    if any(a in ("-h", "--help") for a in args):
        return tyro.cli(cls, **kw)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return tyro.cli(cls, **kw)
    except SystemExit:
        raise FlagError(_tyro_error(err.getvalue())) from None
