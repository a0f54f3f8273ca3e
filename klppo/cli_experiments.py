"""``klppo sweep``, ``klppo report`` and ``klppo demo``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def add_parsers(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of conditions x seeds (local pool or Ray)")
    p.add_argument("--spec", help="sweep spec YAML (preset, base, conditions, grid, seeds)")
    p.add_argument("--out", required=True, help="sweep directory (re-running it resumes)")
    p.add_argument("--preset", help="base preset (with flags instead of --spec)")
    p.add_argument("--objectives", nargs="+", help="one condition per objective")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default 0 1 2)")
    p.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="base overrides, e.g. total_steps=50000 ppo.lr=0.001")
    p.add_argument("--grid", nargs="+", default=[], metavar="FIELD=V1,V2",
                   help="grid axes, e.g. kl.target=0.01,0.02")
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    p.add_argument("--workers", type=int, help="parallel runs (local; default: one per core)")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("report", help="tables, figures and report.html from runs or sweeps")
    p.add_argument("paths", nargs="+", help="run directories, sweep directories, or parents")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("demo", help="the main job: the KLip-PPO four-way comparison on "
                                    "CartPole (3 seeds), then the report")
    p.add_argument("--out", default="runs/demo", help="sweep directory (default runs/demo)")
    p.add_argument("--workers", type=int, help="parallel runs (default: one per core)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.set_defaults(func=cmd_demo)


def _value(text: str) -> Any:
    return yaml.safe_load(text)


def spec_from_args(args: argparse.Namespace):
    from klppo.runs.sweep import SweepSpec

    if args.spec:
        spec = SweepSpec.from_dict(yaml.safe_load(Path(args.spec).read_text()) or {})
    else:
        spec = SweepSpec(preset=args.preset or "klip/cartpole")
        if args.objectives:
            spec.conditions = {o: {"objective": o} for o in args.objectives}
    if args.seeds:
        spec.seeds = list(args.seeds)
    for item in args.set:
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        spec.base[key] = _value(val)
    for item in args.grid:
        key, sep, vals = item.partition("=")
        if not sep:
            raise ValueError(f"--grid {item!r}: expected FIELD=V1,V2")
        spec.grid[key] = [_value(v) for v in vals.split(",")]
    return spec


def _progress(total: int):
    state = {"done": 0, "t0": time.perf_counter()}

    def on_done(entry) -> None:
        state["done"] += 1
        msg = f" ({entry.error})" if entry.error else ""
        took = "skipped, " if entry.wall_s is None else f"{entry.wall_s:.0f} s, "
        print(f"[{state['done']}/{total}] {entry.name}: {entry.state}{msg} "
              f"({took}sweep at {time.perf_counter() - state['t0']:.0f} s)", flush=True)
    return on_done


def _run_sweep(spec, out: str, backend: str, workers: int | None) -> int:
    from klppo.runs.sweep import expand, run_sweep

    n = len(expand(spec))
    print(f"sweep: {n} runs into {out} (backend {backend})", flush=True)
    res = run_sweep(spec, out, backend=backend, workers=workers, on_done=_progress(n))
    failed = res.failed
    print(f"sweep: {len(res.entries) - len(failed)} finished, {len(failed)} failed")
    for e in failed:
        print(f"  FAILED {e.name}: {e.error}  (see {out}/runs/{e.name}/status.json)")
    return 1 if failed else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from klppo.rl.config import ConfigError

    try:
        spec = spec_from_args(args)
        return _run_sweep(spec, args.out, args.backend, args.workers)
    except (ConfigError, ValueError, OSError) as e:
        print(f"klppo sweep: {e}", file=sys.stderr)
        return 2


def cmd_report(args: argparse.Namespace) -> int:
    from klppo.report import format_table, make_report

    rep = make_report(args.paths, args.out)
    for path, why in rep.skipped:
        print(f"skipped {path}: {why}")
    for note in rep.notes:
        print(f"note: {note}")
    if not rep.summaries:
        print("report: no readable run found", file=sys.stderr)
        return 1
    print(format_table(rep.summaries))
    for q in rep.equivalences:
        print(f"equivalence {q.env} seed {q.seed}: max |clip - per_sample_kl| return "
              f"difference {q.max_abs_diff:.3g} over {q.iterations} iterations")
    print(f"report: {rep.html.resolve()}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import dataclasses

    from klppo.report import format_table, make_report
    from klppo.runs.sweep import DEMO_SPEC

    t0 = time.perf_counter()
    spec = dataclasses.replace(DEMO_SPEC, seeds=list(args.seeds))
    print("klppo demo: the KLip-PPO four-way comparison on CartPole-v1 (klip/cartpole, "
          f"100k steps, seeds {spec.seeds}): clip, per_sample_kl, fixed-beta and adaptive-beta "
          "kl_penalty", flush=True)
    code = _run_sweep(spec, args.out, "local", args.workers)
    rep = make_report([args.out], Path(args.out) / "report")
    print()
    print(format_table(rep.summaries))
    for q in rep.equivalences:
        print(f"clip vs per_sample_kl, seed {q.seed}: max return-curve difference "
              f"{q.max_abs_diff:.3g}")
    print(f"\nreport: {rep.html.resolve()}")
    print(f"demo finished in {time.perf_counter() - t0:.0f}s")
    return code
