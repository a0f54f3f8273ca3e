"""``klppo sweep``, ``klppo report`` and ``klppo demo``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class FlagError(ValueError):
    """A malformed command-line value; the message starts with ``--flag=value:``."""


SWEEP_EPILOG = (
    "Ctrl-C or SIGTERM: no new runs; running runs finish their iteration, checkpoint and are "
    "recorded as interrupted (a second Ctrl-C kills them; they resume from their last "
    "checkpoint). Run the same command again to resume. Exit codes: 0 all runs finished, "
    "1 a run failed or is unfinished, 2 bad input or the directory is in use by another sweep, "
    "130 / 143 stopped by SIGINT / SIGTERM.")


def add_parsers(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of conditions x seeds (local pool or Ray)",
                       epilog=SWEEP_EPILOG)
    p.add_argument("--spec", help="sweep spec YAML (preset, base, conditions, grid, seeds)")
    p.add_argument("--out", required=True, help="sweep directory (re-running it resumes)")
    p.add_argument("--preset", help="base preset (with flags instead of --spec)")
    p.add_argument("--objectives", nargs="+", help="one condition per objective")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default 0 1 2)")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                   help="base overrides, e.g. total_steps=50000 ppo.lr=0.001 (may be repeated)")
    p.add_argument("--grid", nargs="+", action="extend", default=[], metavar="FIELD=V1,V2",
                   help="grid axes, e.g. kl.target=0.01,0.02 (may be repeated)")
    p.add_argument("--max-runs", type=int, default=None, metavar="N",
                   help="allow a sweep of more than 10,000 runs (default: refused)")
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    p.add_argument("--workers", type=int, help="parallel runs (local; default: one per core)")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("report", help="tables, figures and report.html from runs or sweeps")
    p.add_argument("paths", nargs="+", help="run directories, sweep directories, or parents")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--smooth", type=int, default=1, metavar="K",
                   help="figures: moving average over K iterations (default 1: raw curves; "
                        "tables are never smoothed)")
    p.add_argument("--finished-only", action="store_true",
                   help="leave out runs that did not finish (a sweep still under way)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("demo", help="the main job: the KLip-PPO four-way comparison on "
                                    "CartPole (3 seeds), then the report")
    p.add_argument("--out", default="runs/demo", help="sweep directory (default runs/demo)")
    p.add_argument("--workers", type=int, help="parallel runs (default: one per core)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.set_defaults(func=cmd_demo)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _value(flag: str, item: str, text: str) -> Any:
    """A flag's value read as YAML, as a config file's would be (``1e-4`` is a float)."""
    from klppo.runs.configfile import InputError, parse_yaml

    try:
        return parse_yaml(text, "value")
    except InputError as e:
        raise FlagError(f"{flag}={item!r}: {text!r} is not a YAML value ({_one_line(e)})") \
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
    """The sweep spec the flags ask for (raises ConfigError naming the flag or file)."""
    from klppo.experiments.sweep import SweepSpec, load_spec

    if args.spec:
        spec = load_spec(args.spec)
    else:
        spec = SweepSpec(preset=args.preset or "klip/cartpole")
        if args.objectives:
            spec.conditions = {o: {"objective": o} for o in args.objectives}
    if args.seeds is not None:
        spec.seeds = list(args.seeds)
    spec.base, sets = dict(spec.base or {}), {}
    for item in args.set:
        key, val = _key_value("--set", item, "FIELD=VALUE")
        _once("--set", item, key, sets)
        spec.base[key] = sets[key] = _value("--set", item, val)
    spec.grid, grids = dict(spec.grid or {}), {}
    for item in args.grid:
        key, vals = _key_value("--grid", item, "FIELD=V1,V2")
        if any(not v.strip() for v in vals.split(",")):
            raise FlagError(f"--grid={item!r}: expected FIELD=V1,V2 (an empty value)")
        _once("--grid", item, key, grids)
        spec.grid[key] = grids[key] = [_value("--grid", item, v) for v in vals.split(",")]
    return spec.check()


def check_run_flags(workers: int | None, out: str, max_runs: int | None = None) -> None:
    if workers is not None and workers < 1:
        raise FlagError(f"--workers={workers}: must be >= 1 (parallel runs)")
    if max_runs is not None and max_runs < 1:
        raise FlagError(f"--max-runs={max_runs}: must be >= 1")
    if Path(out).exists() and not Path(out).is_dir():
        raise FlagError(f"--out={out!r}: exists and is not a directory")


def _progress(total: int):
    state = {"done": 0, "t0": time.perf_counter()}

    def on_done(entry) -> None:
        state["done"] += 1
        msg = f" ({entry.error})" if entry.error else ""
        took = "skipped, " if entry.wall_s is None else f"{entry.wall_s:.0f} s, "
        print(f"[{state['done']}/{total}] {entry.name}: {entry.state}{msg} "
              f"({took}sweep at {time.perf_counter() - state['t0']:.0f} s)", flush=True)
    return on_done


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


def _run_sweep(spec, out: str, backend: str, workers: int | None,
               max_runs: int | None = None) -> int:
    from klppo.experiments.sweep import MAX_RUNS, expand, run_sweep

    limit = max_runs or MAX_RUNS
    n = len(expand(spec, limit))
    print(f"sweep: {n} runs into {out} (backend {backend})", flush=True)
    res = run_sweep(spec, out, backend=backend, workers=workers, on_done=_progress(n),
                    max_runs=limit)
    return _summary(res, out)


def _guarded(command: str, body: Callable[[], int]) -> int:
    """Run ``body``; bad input and a busy directory are one line on stderr and exit code 2."""
    from klppo.cli_common import say_error
    from klppo.rl.config import ConfigError
    from klppo.runs.configfile import InputError
    from klppo.runs.rundir import DirBusyError

    try:
        return body()
    except (FlagError, ConfigError, InputError, DirBusyError, OSError) as e:
        say_error(command, e)
        return 2
    except KeyboardInterrupt:  # before the sweep took over the signal
        say_error(command, "interrupted")
        return 130


def cmd_sweep(args: argparse.Namespace) -> int:
    def body() -> int:
        spec = spec_from_args(args)
        check_run_flags(args.workers, args.out, args.max_runs)
        return _run_sweep(spec, args.out, args.backend, args.workers, args.max_runs)
    return _guarded("sweep", body)


def _check_report_args(paths: list[str], out: str, smooth: int = 1) -> None:
    if smooth < 1:
        raise FlagError(f"--smooth={smooth}: must be an integer >= 1 (iterations)")
    for p in paths:
        if not Path(p).exists():
            raise FlagError(f"{p}: does not exist")
    if Path(out).exists() and not Path(out).is_dir():
        raise FlagError(f"--out={out!r}: exists and is not a directory")


def cmd_report(args: argparse.Namespace) -> int:
    from klppo.report import format_table, make_report

    try:
        _check_report_args(args.paths, args.out, args.smooth)
        rep = make_report(args.paths, args.out, smooth=args.smooth,
                          finished_only=args.finished_only)
    except (FlagError, OSError) as e:
        print(f"klppo report: {_one_line(e)}", file=sys.stderr)
        return 2
    for path, why in rep.skipped:
        print(f"skipped {path}: {_one_line(why)}")
    for note in rep.notes:
        print(f"note: {note}")
    if not rep.summaries:
        print("report: no readable run found", file=sys.stderr)
        return 1
    print(format_table(rep.summaries))
    for q in rep.equivalences:
        who = f" policy {q.policy}" if q.policy is not None else ""
        print(f"equivalence {q.env} seed {q.seed}{who}: max |clip - per_sample_kl| return "
              f"difference {q.max_abs_diff:.3g} over {q.iterations} iterations")
    print(f"report: {rep.html.resolve()}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import dataclasses

    from klppo.experiments.sweep import DEMO_SPEC

    t0 = time.perf_counter()

    def body() -> int:
        spec = dataclasses.replace(DEMO_SPEC, seeds=list(args.seeds)).check()
        check_run_flags(args.workers, args.out)
        print("klppo demo: the KLip-PPO four-way comparison on CartPole-v1 (klip/cartpole, "
              f"100k steps, seeds {spec.seeds}): clip, per_sample_kl, fixed-beta and "
              "adaptive-beta kl_penalty", flush=True)
        return _run_sweep(spec, args.out, "local", args.workers)

    code = _guarded("demo", body)
    if code in (2, 130) or code > 128:  # bad input, or stopped: no report
        return code
    _demo_report(args.out)
    print(f"demo finished in {time.perf_counter() - t0:.0f}s")
    return code


def _demo_report(out: str) -> None:
    from klppo.report import format_table, make_report

    rep = make_report([out], Path(out) / "report")
    print()
    print(format_table(rep.summaries))
    for q in rep.equivalences:
        print(f"clip vs per_sample_kl, seed {q.seed}: max return-curve difference "
              f"{q.max_abs_diff:.3g}")
    print(f"\nreport: {rep.html.resolve()}")
