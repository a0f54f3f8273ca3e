"""``klppo demo``: the KLip-PPO four-way comparison on CartPole, then the report."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from klppo.cli.errors import BAD_INPUT, INTERRUPTED, REPORTED, fail
from klppo.cli.flags import path_arg
from klppo.cli.sweep import check_run_flags, run_and_summarise

DESCRIPTION = ("The main job: clip, per_sample_kl, and kl_penalty with a fixed and with an "
               "adaptive beta on CartPole-v1 (preset klip/cartpole, 100k steps) for each seed, "
               "as a local sweep into OUT, then the report in OUT/report. Finished runs of an "
               "earlier demo in OUT are reused.")


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="the main job: the KLip-PPO four-way comparison on "
                                    "CartPole (3 seeds), then the report",
                       description=DESCRIPTION)
    p.add_argument("--out", type=path_arg, default="runs/demo",
                   help="sweep directory (default runs/demo)")
    p.add_argument("--workers", type=int, help="parallel runs (default: one per core)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="seeds (default 0 1 2)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from klppo.experiments.sweep import DEMO_SPEC

    t0 = time.perf_counter()
    try:
        spec = dataclasses.replace(DEMO_SPEC, seeds=list(args.seeds)).check()
        check_run_flags(args.workers, args.out)
        print("klppo demo: the KLip-PPO four-way comparison on CartPole-v1 (klip/cartpole, "
              f"100k steps, seeds {spec.seeds}): clip, per_sample_kl, fixed-beta and "
              "adaptive-beta kl_penalty", flush=True)
        code = run_and_summarise(spec, args.out, "local", args.workers, table=False)
    except REPORTED as e:
        return fail("demo", e)
    if code in (BAD_INPUT, INTERRUPTED) or code > 128:  # stopped: no report
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
