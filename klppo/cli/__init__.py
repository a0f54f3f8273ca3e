"""The ``klppo`` command: one module per sub-command under ``klppo.cli``.

``train``, ``lm`` and ``rlhf`` parse their own flags (tyro over a config dataclass; the rest of
argv is passed through); the other sub-commands are argparse sub-parsers, each module adding
its own with ``add_parser(sub)``. Every problem is one line on stderr
(:func:`klppo.cli.errors.say_error`) with the exit status of :mod:`klppo.cli.errors`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from klppo.cli.errors import INTERRUPTED, say_error
from klppo.cli.flags import OneLineParser
from klppo.cli.progress import StderrHandler, one_line_warnings

__all__ = ["main", "build_parser", "PASSTHROUGH", "SUBPARSERS"]

# Thread counts are not set here: every run sets its BLAS and torch pools inside the process
# (klppo.runs.threads), so the CLI and the Python API compute the same numbers.

#: sub-commands with their own argument parsing: name -> (module, `klppo --help` line); the
#: module's ``run(argv)`` gets the rest of argv
PASSTHROUGH: dict[str, tuple[str, str]] = {
    "train": ("klppo.cli.train", "train PPO (any objective and KL controller) on a Gymnasium or "
                                 "PettingZoo env; --resume continues a run"),
    "lm": ("klppo.cli.lm", "language model: klppo lm pretrain (needs the lm extra)"),
    "rlhf": ("klppo.cli.rlhf", "RLHF-style PPO on a LM; `klppo rlhf compare` runs fixed vs "
                               "adaptive arms (needs the lm extra)"),
}
#: argparse sub-commands, in `klppo --help` order: each module has ``add_parser(sub)``
SUBPARSERS = ("verify", "sweep", "tune", "report", "demo", "replay", "eval", "snapshot")


def version() -> str:
    """``klppo X.Y.Z (python A.B.C, torch T)``: what ``klppo --version`` prints."""
    import platform
    from importlib import metadata

    ours = sys.modules["klppo"].__version__  # the package this command is part of
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return f"klppo {ours} (python {platform.python_version()}, torch {torch})"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="klppo", description="KL-controlled policy optimisation: train PPO with KL "
        "control on Gymnasium and PettingZoo envs or a small language model, run sweeps and "
        "tuning studies, and report, replay and evaluate the results. `klppo COMMAND --help` "
        "describes each command and its flags.")
    parser.add_argument("--version", action="version", version=version(),
                        help="print klppo's version (and python's and torch's) and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands")
    for name, (_, help_line) in PASSTHROUGH.items():
        sub.add_parser(name, help=help_line, description=help_line, add_help=False)
    for name in SUBPARSERS:
        importlib.import_module(f"klppo.cli.{name}").add_parser(sub)
    return parser


def find_modules_in_cwd() -> str | None:
    """Let ``--env mymodule:Env-v0`` import ``mymodule.py`` from the working directory, as
    ``python -m`` would (the ``klppo`` script's own ``sys.path`` starts at its folder): the
    working directory goes at the **end** of ``sys.path``, so it never shadows an installed
    package. The command line only: the library imports what ``sys.path`` holds. Returns the
    entry added (None: it was there already)."""
    import os

    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed
        return None
    if any(p in ("", ".", cwd) for p in sys.path):
        return None
    sys.path.append(cwd)
    return cwd


def main(argv: list[str] | None = None) -> int:
    added = find_modules_in_cwd()
    try:
        return _main(argv)
    finally:  # a caller in the same process (a test, a notebook) gets its sys.path back
        if added is not None and added in sys.path:
            sys.path.remove(added)


def _main(argv: list[str] | None) -> int:
    import logging

    argv = list(sys.argv[1:] if argv is None else argv)
    root = logging.getLogger()
    if not root.handlers:  # warnings go to the stderr of the moment (above a live bar)
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
    try:
        with one_line_warnings():
            if argv and argv[0] in PASSTHROUGH:
                return importlib.import_module(PASSTHROUGH[argv[0]][0]).run(argv[1:])
            args = build_parser().parse_args(argv)
            run: Callable[[argparse.Namespace], int] = args.func
            return run(args)
    except KeyboardInterrupt:  # Ctrl-C before a command took over the signal (imports, parsing)
        say_error(argv[0] if argv and not argv[0].startswith("-") else "", "interrupted")
        return INTERRUPTED
