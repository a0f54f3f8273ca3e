"""``klppo sweep``: a grid of conditions x seeds from a spec file or flags (``klppo demo`` runs
a fixed one through :func:`run_and_summarise`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klppo.cli.errors import REPORTED, FlagError, fail, one_line
from klppo.cli.flags import MAX_WORKERS, Once, name_arg, path_arg, yaml_value
from klppo.cli.progress import Bar, Part, clock
from klppo.runs.errors import InputError
from klppo.runs.install import install_hint
from klppo.runs.owned import container_reason

if TYPE_CHECKING:
    from klppo.experiments.sweep import Backend

DESCRIPTION = ("Run every condition of a sweep spec (YAML: preset, base, conditions, grid, "
               "seeds) or of the flags, for every seed, into OUT/runs/<name>, then print a "
               "summary. Finished runs are skipped when the same command runs again.")

SWEEP_EPILOG = (
    "Ctrl-C or SIGTERM: no new runs; running runs finish their iteration, checkpoint and are "
    "recorded as interrupted (a second Ctrl-C kills them; they resume from their last "
    "checkpoint). Run the same command again to resume. Exit codes: 0 all runs finished, "
    "1 a run failed or is unfinished, 2 bad input or the directory is in use by another sweep, "
    "130 / 143 stopped by SIGINT / SIGTERM.")


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of conditions x seeds (local pool or Ray)",
                       description=DESCRIPTION, epilog=SWEEP_EPILOG)
    p.add_argument("--spec", type=path_arg, action=Once,
                   help="sweep spec YAML (preset, base, conditions, grid, seeds)")
    p.add_argument("--out", type=path_arg, required=True,
                   help="sweep directory (re-running it resumes)")
    p.add_argument("--preset", type=name_arg, action=Once,
                   help="base preset (with flags instead of --spec)")
    p.add_argument("--objectives", nargs="+", help="one condition per objective")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default 0 1 2)")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                   help="base overrides, e.g. total_steps=50000 ppo.lr=0.001 (may be repeated)")
    p.add_argument("--grid", nargs="+", action="extend", default=[], metavar="FIELD=V1,V2",
                   help="grid axes, e.g. kl.target=0.01,0.02 (may be repeated)")
    p.add_argument("--max-runs", type=int, default=None, metavar="N",
                   help="allow a sweep of more than 10,000 runs (default: refused)")
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local: a process pool on this machine (default); ray: one Ray task "
                        "per group (per run with --group-size 1), on the cluster at "
                        "RAY_ADDRESS or a local Ray instance (needs the ray extra: "
                        f"{install_hint('ray')})")
    p.add_argument("--workers", type=int,
                   help="parallel workers (default: one per core, or per CPU of the Ray "
                        "cluster): local worker processes, or the Ray tasks a batched sweep "
                        "spreads each shape's runs over")
    p.add_argument("--group-size", type=int, default=None, metavar="N",
                   help="at most N runs per process (default: a shape's runs spread evenly over "
                        "the workers; 1: each run in a process of its own). The runs that can "
                        "share a group (same spaces, network, sizes, step library and device) "
                        "train together, each in its own directory with the numbers it has "
                        "alone")
    p.add_argument("--engine", choices=["process", "batched"], default=None,
                   help=argparse.SUPPRESS)  # before --group-size: process is --group-size 1
    p.set_defaults(func=cmd_sweep)


def _value(flag: str, item: str, text: str) -> Any:
    """A flag's value read as YAML, as a config file's would be (``1e-4`` is a float)."""
    try:
        return yaml_value(text, "value")
    except InputError as e:
        raise FlagError(f"{flag}={item!r}: {text!r} is not a YAML value ({one_line(e)})") \
            from None


def _once(flag: str, item: str, key: str, seen: dict[str, Any]) -> None:
    """A field may be given once per flag (the last would silently win)."""
    if key in seen:
        raise FlagError(f"{flag}={item!r}: {key} is given twice; give each field once")


def _key_value(flag: str, item: str, form: str) -> tuple[str, str]:
    key, sep, val = item.partition("=")
    if not sep or not key.strip() or not val.strip():
        raise FlagError(f"{flag}={item!r}: expected {form}")
    return key.strip(), val


def spec_from_args(args: argparse.Namespace):
    """The sweep spec the flags ask for (a UserInputError naming the flag or file)."""
    from klppo.experiments.sweep import SweepSpec, load_spec

    if args.spec:
        for flag, value in (("--preset", args.preset), ("--objectives", args.objectives)):
            if value:
                raise FlagError(f"{flag}={value!r}: the spec {args.spec!r} names the preset and "
                                f"the conditions; give them there (or drop --spec)")
        spec = load_spec(args.spec)
    else:
        spec = SweepSpec(preset=args.preset or "klip/cartpole")
        if args.objectives:
            if len(set(args.objectives)) != len(args.objectives):
                raise FlagError(f"--objectives={args.objectives!r}: an objective is given twice")
            spec.conditions = {o: {"objective": o} for o in args.objectives}
    if args.seeds is not None:
        spec.seeds = list(args.seeds)
    sets: dict[str, Any] = {}
    spec.base = dict(spec.base or {})
    for item in args.set:
        key, val = _key_value("--set", item, "FIELD=VALUE")
        _once("--set", item, key, sets)
        spec.base[key] = sets[key] = _value("--set", item, val)
    grids: dict[str, Any] = {}
    spec.grid = dict(spec.grid or {})
    for item in args.grid:
        key, vals = _key_value("--grid", item, "FIELD=V1,V2")
        if any(not v.strip() for v in vals.split(",")):
            raise FlagError(f"--grid={item!r}: expected FIELD=V1,V2 (an empty value)")
        _once("--grid", item, key, grids)
        spec.grid[key] = grids[key] = [_value("--grid", item, v) for v in vals.split(",")]
    return spec.check()


def check_run_flags(workers: int | None, out: str, max_runs: int | None = None,
                    group_size: int | None = None, engine: str | None = None) -> None:
    """FlagError for a worker count, run limit or group size below 1, a group size beside
    the old ``--engine process``, or an --out that is a file or where the sweep's files would
    land on what a run or study owns."""
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise FlagError(f"--workers={workers}: must be >= 1 and at most {MAX_WORKERS:,} "
                        f"(parallel runs)")
    if group_size is not None and group_size < 1:
        raise FlagError(f"--group-size={group_size}: must be >= 1 (runs per process)")
    if group_size is not None and engine == "process":
        raise FlagError(f"--group-size={group_size} with --engine process: --engine process "
                        "is --group-size 1; give only --group-size")
    if max_runs is not None and max_runs < 1:
        raise FlagError(f"--max-runs={max_runs}: must be >= 1")
    owned = container_reason(out, "sweep")
    if owned is not None:  # a run's or study's file or folder: never written
        raise FlagError(owned)
    if Path(out).exists() and not Path(out).is_dir():
        raise FlagError(f"--out={out!r}: exists and is not a directory")


class SweepProgress:
    """A line per run that ends (``[k/n] name: state (its time, the sweep's, ETA)``) and, on a
    terminal, a bar under them with the counts and the ETA. The ETA is the rate of the runs
    that ended in this invocation since it began (runs go in parallel) times the runs left
    (runs finished before are not run again), given once the first wave of runs has ended
    (before, one run of a group that ends together says nothing of the time left)."""

    def __init__(self, total: int, already_finished: int = 0, wave: int = 1) -> None:
        self.total, self.done = total, 0
        self.bar = Bar(max(1, total - already_finished), every=1, eta_from_first=False,
                       wave=wave)
        self.counts: dict[str, int] = {}

    def __call__(self, entry) -> None:
        self.done += 1
        self.counts[entry.state] = self.counts.get(entry.state, 0) + 1
        eta = self.bar.eta
        eta.update(self.done)
        left = eta.left
        msg = f" ({entry.error})" if entry.error else ""
        took = "skipped, " if entry.wall_s is None else f"{entry.wall_s:.0f} s, "
        line = (f"[{self.done}/{self.total}] {entry.name}: {entry.state}{msg} ({took}sweep at "
                f"{eta.elapsed:.0f} s, ETA {'-' if left is None else clock(left)})")
        self.bar.print(line)
        if self.bar.tty:
            counts = "  ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
            self.bar.update(self.done, [Part.of(10, f"runs {self.done}/{self.total}"),
                                        Part.of(6, counts)])

    def close(self) -> None:
        self.bar.close()


def _already_finished(plans, out: str) -> int:
    """Runs of ``plans`` that a previous invocation finished (they are not run again; for the
    ETA only: a damaged status file is the sweep's to refuse)."""
    from klppo.runs.rundir import read_status

    def finished(name: str) -> bool:
        try:
            st = read_status(Path(out) / "runs" / name)
        except (OSError, UnicodeDecodeError):
            return False
        return isinstance(st, dict) and st.get("state") == "finished"

    return sum(finished(p.name) for p in plans)


def _summary(res, out: str) -> int:
    """Print what happened; the exit code: 128 + signal if stopped, 1 if any run is not
    finished, else 0."""
    import signal

    print(f"sweep: {len(res.finished)} finished, {len(res.interrupted)} interrupted, "
          f"{len(res.failed)} failed, {len(res.not_started)} not started", flush=True)
    for e in res.interrupted:
        print(f"  INTERRUPTED {e.name}  (resumes from its last checkpoint)")
    for e in res.failed:
        print(f"  FAILED {e.name}: {e.error}  (see {out}/runs/{e.name}/status.json)")
    if res.stop_signal is not None:
        print(f"sweep: stopped by {signal.Signals(res.stop_signal).name}; run the same "
              f"command again to resume", flush=True)
        return 128 + res.stop_signal
    return 1 if res.unfinished else 0


def run_and_summarise(spec, out: str, backend: Backend, workers: int | None,
                      max_runs: int | None = None, group_size: int | None = None,
                      table: bool = True) -> int:
    """Run the sweep ``spec`` into ``out`` with a line per run; :func:`_summary`'s exit code.
    ``table``: end with the final returns of the sweep's finished runs (``klppo report``'s
    table)."""
    from klppo.experiments.sweep import (
        MAX_RUNS,
        check_envs,
        expand,
        plan_groups,
        run_sweep,
        worker_count,
    )

    limit = max_runs or MAX_RUNS
    plans = expand(spec, limit)
    check_envs(plans)  # before the first line: a refused sweep prints only its reason
    groups, _ = plan_groups(plans, group_size, worker_count(workers))
    n = len(plans)
    batched = sum(len(g) for g in groups if len(g) > 1)
    how = (f"backend {backend}, {n} runs in {len(groups)} group(s): {batched} sharing a "
           f"process, {n - batched} alone")
    # the runs of the first groups start together and, grouped, end together: no ETA before
    progress = SweepProgress(n, _already_finished(plans, out),
                             wave=sum(len(g) for g in groups[:worker_count(workers)]))
    try:  # the first line once the sweep's checks passed: a refused sweep prints its reason only
        res = run_sweep(spec, out, backend=backend, workers=workers, on_done=progress,
                        max_runs=limit, group_size=group_size,
                        on_start=lambda: print(f"sweep: {n} runs into {out} ({how})", flush=True))
    finally:
        progress.close()
    code = _summary(res, out)
    if table and res.finished and res.stop_signal is None:
        _table(out)
    return code


def _table(out: str) -> None:
    """The final-return table of the finished runs under ``out`` (what ``klppo report``
    writes to final_returns.md), and how to make the report."""
    from klppo.report import final_returns, format_table

    print()
    print(format_table(final_returns([out], finished_only=True)))
    print(f"\nfigures and the comparison: klppo report {out} --out REPORT_DIR", flush=True)


def cmd_sweep(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
        check_run_flags(args.workers, args.out, args.max_runs, args.group_size, args.engine)
        group_size = 1 if args.engine == "process" else args.group_size
        return run_and_summarise(spec, args.out, args.backend, args.workers, args.max_runs,
                                 group_size)
    except REPORTED as e:
        return fail("sweep", e)
