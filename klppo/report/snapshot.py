"""Results snapshots for ``docs/results/``: the report's tables with a header that names the
machine they were measured on, written by a command (``make demo-table``), never typed.

:func:`write_snapshot` (on the command line ``klppo snapshot RUNS DEST [--title T]
[--command C] [--smooth K]``) writes ``DEST/final_returns.md``, ``DEST/equivalence.md`` and,
where runs log a kill set, ``DEST/partition.md`` (each with the header), and
``DEST/report.html``, and ``DEST/aggregates.md`` (IQM, probability of improvement) where an env
has two conditions or more.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from klppo.report.build import Report, format_table, make_report
from klppo.report.compare import comparison_markdown
from klppo.report.load import load_runs
from klppo.report.partition import partition_table

__all__ = ["FLOAT_NOTE", "header", "write_snapshot"]

#: what every snapshot says about its numbers
FLOAT_NOTE = ("Float results differ across machines (CPU model and instruction set, torch "
              "build, thread count): the same command gives these numbers on the same machine "
              "and software, and different (statistically similar) ones elsewhere.")


PARTITION_NOTE = ("peak over training of the seed-mean kill fraction (samples whose clipped "
                  "gradient is zero, where beta_t = -w_t A_t), the mean |beta_t| on the kill "
                  "set, and the quantiles of |beta_t| over all samples (0 off the kill set, so "
                  "q50 and q90 are 0 while fewer than 50% and 10% of the samples are killed), "
                  "averaged over the last 10% of environment steps; mean ± population std over "
                  "seeds.")


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
                   command: str, smooth: int | None = None, finished_only: bool = False) -> Report:
    """The report of ``paths`` as a snapshot in ``dest``: tables with :func:`header`, and the
    self-contained report.html (figures embedded, ``smooth`` as in ``make_report``; nothing
    else is copied). No readable run: ``NoRunsError`` before ``dest`` is made."""
    dest = Path(dest)
    with tempfile.TemporaryDirectory() as tmp:
        rep = make_report(paths, tmp, smooth=smooth, finished_only=finished_only)
        dest.mkdir(parents=True, exist_ok=True)
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
        if rep.comparisons:
            (dest / "aggregates.md").write_text(
                top + "\n" + comparison_markdown(rep.comparisons, heading=False))
        shutil.copyfile(rep.html, dest / "report.html")
    return rep
