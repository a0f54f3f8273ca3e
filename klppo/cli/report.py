"""``klppo report``: tables, figures and report.html from run or sweep directories."""

from __future__ import annotations

import argparse
from pathlib import Path

from klppo.cli.errors import REPORTED, FlagError, fail, one_line
from klppo.cli.flags import path_arg

DESCRIPTION = ("Read run directories (or sweep directories, or their parents) and write the "
               "final-return table, the clip vs per_sample_kl equivalence check, rliable-style "
               "aggregates (IQM, performance profile, probability of improvement), figures and "
               "a self-contained report.html into OUT. Reads files only; trains nothing. An "
               "earlier report in OUT is replaced only with --force.")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="tables, figures and report.html from runs or sweeps",
                       description=DESCRIPTION)
    p.add_argument("paths", nargs="+", help="run directories, sweep directories, or parents")
    p.add_argument("--out", type=path_arg, required=True, help="output directory")
    p.add_argument("--smooth", type=int, default=None, metavar="K",
                   help="figures: trailing moving average over K iterations, stated in each "
                        "figure (default: about 5%% of the runs' iterations; 1: raw curves; "
                        "tables are never smoothed)")
    p.add_argument("--finished-only", action="store_true",
                   help="leave out runs that did not finish (a sweep still under way)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier report in OUT (its tables, report.html and the "
                        "figures in OUT/figures); without it an earlier report is refused")
    p.set_defaults(func=cmd_report)


def check_report_args(paths: list[str], out: str, smooth: int | None = None,
                      force: bool = False) -> None:
    """FlagError naming the flag (or the path) that cannot be read or written, a destination
    that would write into what a run or sweep owns (whatever ``force`` says), or the earlier
    report that ``out`` holds (without ``force``)."""
    from klppo.report.build import REPORT_FILES, earlier_report
    from klppo.runs.owned import owned_reason

    if smooth is not None and not 1 <= smooth <= 100_000:
        raise FlagError(f"--smooth={smooth}: must be an integer in [1, 100,000] (iterations)")
    for p in paths:
        if not Path(p).exists():
            raise FlagError(f"{p}: does not exist")
    reason = owned_reason(out, REPORT_FILES, "--out")
    if reason is not None:  # a run's or sweep's file: never, --force or not
        raise FlagError(reason)
    if Path(out).exists() and not Path(out).is_dir():
        raise FlagError(f"--out={out!r}: exists and is not a directory")
    found = earlier_report(out)
    if found and not force:
        raise FlagError(f"--out={out!r}: holds an earlier report ({', '.join(found)}); pass "
                        "--force to replace it, or choose another --out")


def cmd_report(args: argparse.Namespace) -> int:
    from klppo.report import format_table, make_report

    try:
        check_report_args(args.paths, args.out, args.smooth, args.force)
        rep = make_report(args.paths, args.out, smooth=args.smooth,
                          finished_only=args.finished_only)
    except REPORTED as e:
        return fail("report", e)
    for path, why in rep.skipped:
        print(f"skipped {path}: {one_line(why)}")
    for note in rep.notes:
        print(f"note: {note}")
    print(format_table(rep.summaries))
    for q in rep.equivalences:
        who = f" policy {q.policy}" if q.policy is not None else ""
        at = "".join(f" {k}={v}" for k, v in q.settings.items())
        print(f"equivalence {q.env} seed {q.seed}{at}{who}: max |clip - per_sample_kl| return "
              f"difference {q.max_abs_diff:.3g} over {q.iterations} iterations")
    print(f"report: {rep.html.resolve()}")
    return 0
