"""How every ``klppo`` sub-command reports a problem: one line, one exit status.

Bad input prints one line ``klppo <command>: <field>=<value>: <why>`` on stderr and exits 2; a
run that fails exits 1. No traceback reaches the user (status.json keeps the details).

The exit status comes from klppo's error base (:mod:`klppo.runs.errors`): a
:class:`~klppo.runs.errors.RunFailed` exits 1, a :class:`~klppo.runs.errors.UserInputError`
(of which :class:`FlagError` is the command line's) exits 2, and so does a file problem
(``OSError``) or a ``ValueError`` that library code raises for a bad value.
"""

from __future__ import annotations

import sys

from klppo.runs.errors import KlppoError, RunFailed, UserInputError

__all__ = ["BAD_INPUT", "FAILED", "INTERRUPTED", "MAX_LINE", "REPORTED", "FlagError",
           "one_line", "say_error", "exit_code", "fail", "crashed", "signal_exit",
           "stopped_at_once"]

#: exit status of bad input (before any work starts), of a run that failed, of Ctrl-C (a
#: command stopped by a signal exits 128 + its number: 130 for SIGINT, 143 for SIGTERM)
BAD_INPUT, FAILED, INTERRUPTED = 2, 1, 130
#: the longest error line printed (values in messages are cut to a short repr already; this
#: bounds whatever else a message quotes)
MAX_LINE = 300

#: what a command reports as one line (:func:`fail`); anything else is a bug and keeps its
#: traceback. ValueError: library checks that predate :class:`KlppoError` raise it for a bad
#: value (it is also the base of UserInputError).
REPORTED: tuple[type[BaseException], ...] = (KlppoError, OSError, ValueError)


class FlagError(UserInputError):
    """A command-line flag or value that cannot be used; the message starts with the flag
    (``--flag=value: why``) or, for tyro's flags, is tyro's message on one line."""


def one_line(err: BaseException | str) -> str:
    """An error message on one line (continuation lines joined by ' ')."""
    text = str(err) or type(err).__name__
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def say_error(command: str, err: BaseException | str) -> None:
    """``klppo COMMAND: message`` on stderr (``klppo: message`` for no command), on one line
    of at most :data:`MAX_LINE` characters."""
    line = f"klppo {command}: {one_line(err)}" if command else f"klppo: {one_line(err)}"
    print(line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "...", file=sys.stderr)


def exit_code(err: BaseException) -> int:
    """1 for a run that failed (:class:`RunFailed`), 2 for everything else reported."""
    return FAILED if isinstance(err, RunFailed) else BAD_INPUT


def fail(command: str, err: BaseException) -> int:
    """Report ``err`` in one line (:func:`say_error`); its exit status (:func:`exit_code`). A
    closed output pipe (``klppo train --help | head``) ends quietly, as a Unix tool does
    (128 + SIGPIPE), its stdout pointed at /dev/null so the exit flush cannot fail again."""
    if isinstance(err, BrokenPipeError):
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    say_error(command, err)
    return exit_code(err)


def crashed(command: str, err: BaseException) -> int:
    """A run that stopped on an unexpected error: ``failed: Type: message``, exit 1."""
    say_error(command, f"failed: {type(err).__name__}: {err}")
    return FAILED


def signal_exit(signum: int | None) -> int:
    """The exit status of a command stopped by ``signum``: 128 + its number (SIGINT: 130,
    SIGTERM: 143); SIGINT's when it is not known."""
    import signal

    return 128 + int(signum if signum is not None else signal.SIGINT)


def stopped_at_once(command: str, err: BaseException) -> int:
    """A second signal stopped a run mid-iteration (:class:`~klppo.runs.errors.RunInterrupted`,
    or a plain ``KeyboardInterrupt`` before the run began): one line with the resume command
    where there is a run directory; 128 + the signal."""
    run_dir, signum = getattr(err, "run_dir", None), getattr(err, "signum", None)
    if run_dir is None:
        say_error(command, "interrupted")
    else:
        say_error(command, f"stopped at once (second signal; the iteration under way is lost); "
                           f"resume from the last checkpoint with: klppo {command} --resume "
                           f"{run_dir}")
    return signal_exit(signum)
