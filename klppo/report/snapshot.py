"""Results snapshots for ``docs/results/``: the report's tables with a header that names the
machine they were measured on, written by a command (``make demo-table``), never typed.

    python -m klppo.report.snapshot RUNS DEST [--title T] [--command C] [--smooth K]

writes ``DEST/final_returns.md``, ``DEST/equivalence.md`` and, where runs log a kill set,
``DEST/partition.md`` (each with the header), and ``DEST/report.html``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from klppo.report.build import Report, format_table, make_report
from klppo.report.load import load_runs
from klppo.report.partition import partition_table

__all__ = ["FLOAT_NOTE", "header", "write_snapshot", "main"]

#: what every snapshot says about its numbers
FLOAT_NOTE = ("Float results differ across machines (CPU model and instruction set, torch "
              "build, thread count): the same command gives these numbers on the same machine "
              "and software, and different (statistically similar) ones elsewhere.")


PARTITION_NOTE = ("peak over training of the seed-mean kill fraction (samples whose clipped "
                  "gradient is zero, where beta_t = -w_t A_t), and the quantiles of |beta_t| "
                  "over all samples (0 off the kill set), averaged over the last 10% of "
                  "environment steps; mean ± population std over seeds.")


def header(title: str, rep: Report, command: str) -> str:
    """The lines above a snapshot's table: title, machine(s), command, the float note."""
    machines = rep.machines or ["not recorded"]
    lines = [f"# {title}", ""]
    if len(machines) == 1:
        lines.append(f"Measured on: {machines[0]}.")
    else:
        lines += ["Measured on:"] + [f"- {m}" for m in machines]
    lines += ["", f"Regenerate with `{command}` (written {datetime.now(timezone.utc):%Y-%m-%d}"
                  "; not typed by hand).", "", FLOAT_NOTE, ""]
    return "\n".join(lines)


def write_snapshot(paths: list[str | Path], dest: str | Path, title: str,
                   command: str, smooth: int = 1, finished_only: bool = False) -> Report:
    """The report of ``paths`` as a snapshot in ``dest``: tables with :func:`header`, and the
    self-contained report.html (figures embedded, ``smooth`` as in ``make_report``; nothing
    else is copied)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rep = make_report(paths, tmp, smooth=smooth, finished_only=finished_only)
        if not rep.summaries:
            raise ValueError(f"{[str(p) for p in paths]}: no readable run")
        top = header(title, rep, command)
        (dest / "final_returns.md").write_text(
            top + "\nFinal return: mean of training-episode returns over the last 10% of "
            "environment steps per seed; mean ± population std over seeds; IQM with a "
            "bootstrap 95% CI.\n\n" + format_table(rep.summaries) + "\n")
        eq = (Path(tmp) / "equivalence.md").read_text()
        if rep.equivalences:  # clip and per_sample_kl runs of one seed to compare
            (dest / "equivalence.md").write_text(
                top + "\nclip vs per_sample_kl, same seed: max |difference| of the return "
                "curves (0 on any one machine: Theorem 1).\n\n" + eq)
        table = partition_table(load_runs(paths, finished_only).runs)
        if len(table.splitlines()) > 2:
            (dest / "partition.md").write_text(
                top + "\nThe kill set: " + PARTITION_NOTE + "\n\n" + table + "\n")
        shutil.copyfile(rep.html, dest / "report.html")
    return rep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m klppo.report.snapshot",
                                description="write a docs/results snapshot from run directories")
    p.add_argument("paths", nargs="+", help="run or sweep directories")
    p.add_argument("dest", help="snapshot directory, e.g. docs/results/cartpole-demo")
    p.add_argument("--title", default="Results", help="the snapshot's heading")
    p.add_argument("--command", default="python -m klppo.report.snapshot ...",
                   help="the command that regenerates it (shown in the header)")
    p.add_argument("--smooth", type=int, default=1, metavar="K",
                   help="report figures: moving average over K iterations (tables: never)")
    p.add_argument("--finished-only", action="store_true",
                   help="leave out runs that did not finish")
    a = p.parse_args(argv)
    try:
        rep = write_snapshot(a.paths, a.dest, a.title, a.command, a.smooth, a.finished_only)
    except (OSError, ValueError) as e:
        print(f"snapshot: {e}", file=sys.stderr)
        return 2
    print(format_table(rep.summaries))
    print(f"wrote {a.dest}: final_returns.md, equivalence.md, partition.md (where runs log a "
          f"kill set), report.html")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
