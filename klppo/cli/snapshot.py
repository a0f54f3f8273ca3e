"""``klppo snapshot RUNS DEST``: a results snapshot for ``docs/results/`` (the report's tables
under a header naming the machine they were measured on, and report.html)."""

from __future__ import annotations

import argparse

from klppo.cli.errors import REPORTED, FlagError, fail

DESCRIPTION = ("Write a docs/results snapshot from run or sweep directories: "
               "DEST/final_returns.md, DEST/equivalence.md and, where runs log a kill set, "
               "DEST/partition.md, each under a header that names the machines the runs were "
               "measured on and the command that regenerates it, and DEST/report.html.")


def add_parser(sub) -> None:
    p = sub.add_parser("snapshot", help="write a docs/results snapshot from run directories",
                       description=DESCRIPTION)
    p.add_argument("paths", nargs="+", help="run or sweep directories")
    p.add_argument("dest", help="snapshot directory, e.g. docs/results/cartpole-demo")
    p.add_argument("--title", default="Results", help="the snapshot's heading")
    p.add_argument("--command", default="klppo snapshot ...",
                   help="the command that regenerates it (shown in the header)")
    p.add_argument("--smooth", type=int, default=None, metavar="K",
                   help="report figures: moving average over K iterations (default: about "
                        "5%% of the runs' iterations; 1: raw; tables: never)")
    p.add_argument("--finished-only", action="store_true",
                   help="leave out runs that did not finish")
    p.set_defaults(func=cmd_snapshot)


#: what a snapshot writes into DEST
SNAPSHOT_FILES = ("final_returns.md", "equivalence.md", "partition.md", "aggregates.md",
                  "report.html")


def check_snapshot_dest(dest: str, smooth: int | None = None) -> None:
    """FlagError, before any work, when DEST would write into what a run or sweep owns, or
    replace a ``klppo report``'s files (a snapshot rewrites only a snapshot: a report holds
    files a snapshot never writes), or ``smooth`` is out of ``klppo report``'s range."""
    from pathlib import Path

    from klppo.report.build import REPORT_FILES
    from klppo.runs.owned import owned_reason

    if smooth is not None and not 1 <= smooth <= 100_000:
        raise FlagError(f"--smooth={smooth}: must be an integer in [1, 100,000] (iterations)")
    reason = owned_reason(dest, SNAPSHOT_FILES, "dest")
    if reason is not None:
        raise FlagError(reason)
    # a report's files a snapshot never writes (not ``figures/``: a folder of that name may be
    # anyone's)
    report_only = [n for n in REPORT_FILES if n not in SNAPSHOT_FILES and n != "figures"
                   and (Path(dest) / n).is_file()]
    if report_only:
        raise FlagError(f"dest={dest!r}: holds a klppo report ({', '.join(report_only)}), which a "
                        f"snapshot would partly replace; choose another dest")


def cmd_snapshot(args: argparse.Namespace) -> int:
    from klppo.report import format_table
    from klppo.report.snapshot import write_snapshot

    try:
        check_snapshot_dest(args.dest, args.smooth)
        rep = write_snapshot(args.paths, args.dest, args.title, args.command, args.smooth,
                             args.finished_only)
    except REPORTED as e:
        return fail("snapshot", e)
    print(format_table(rep.summaries))
    print(f"wrote {args.dest}: final_returns.md, equivalence.md, partition.md (where runs log a "
          f"kill set), report.html")
    return 0
