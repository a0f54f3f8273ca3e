"""``klppo replay``: the controller lab on the command line."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="feed a KL trace (or a simulated plant) to controllers")
    p.add_argument("trace", nargs="?", help="a run directory, its metrics.jsonl, or a CSV file")
    p.add_argument("--column", help="trace column (default kl_observed / kl_rollout / kl)")
    p.add_argument("--target", type=float, help="target KL (default: the run's, else 0.02)")
    p.add_argument("--controller", nargs="+", metavar="SPEC",
                   help="e.g. step:preset=rllib proportional:beta=1,horizon=10 (default: one "
                        "of each rule)")
    p.add_argument("--closed-loop", action="store_true",
                   help="simulate the KL response to beta instead of replaying a trace")
    p.add_argument("--steps", type=int, default=200, help="closed-loop updates")
    p.add_argument("--seed", type=int, default=0, help="closed-loop noise seed")
    p.add_argument("--drift", type=float, default=1.0, help="plant: log-drift over the run")
    p.add_argument("--noise", type=float, default=0.3, help="plant: lognormal noise sigma")
    p.add_argument("--out", default="replay", help="output directory (CSV, PNG)")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from klppo.replay.lab import (
        Plant,
        closed_loop,
        default_controllers,
        load_trace,
        open_loop,
        parse_controller,
        tracking_metrics,
    )
    from klppo.replay.plots import plot_lab

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if args.closed_loop:
            target = args.target or 0.02
            steps, run_target = list(range(args.steps)), target
        else:
            if not args.trace:
                print("klppo replay: give a trace, or --closed-loop", file=sys.stderr)
                return 2
            steps, kl, run_target = load_trace(args.trace, args.column)
            target = args.target or run_target or 0.02
        specs = args.controller or default_controllers(target)
        ctrls = dict(parse_controller(s, target) for s in specs)
    except (ValueError, FileNotFoundError) as e:
        print(f"klppo replay: {e}", file=sys.stderr)
        return 2
    rows = []
    if args.closed_loop:
        plant = Plant(drift=args.drift, noise=args.noise, seed=args.seed)
        results = [closed_loop(label, c, plant, args.steps) for label, c in ctrls.items()]
        kls = {r.label: r.kl for r in results}
        betas = {r.label: r.beta for r in results}
        rows = [(r.label, r.metrics) for r in results]
        title = f"closed loop: simulated plant (drift {args.drift:g}, noise {args.noise:g})"
    else:
        betas = open_loop(kl, ctrls)
        kls = {"trace": kl}
        rows = [(label, tracking_metrics(kl, b, target, ctrls[label].beta_min,
                                         ctrls[label].beta_max)) for label, b in betas.items()]
        title = f"open loop: {args.trace}"
    with open(out / "replay.csv", "w", newline="") as f:
        w = csv.writer(f)
        labels = list(betas)
        w.writerow(["step", *(f"kl[{k}]" for k in kls), *(f"beta[{k}]" for k in labels)])
        for i, s in enumerate(steps):
            w.writerow([s, *(kls[k][i] for k in kls), *(betas[k][i] for k in labels)])
    png = plot_lab(steps, kls, betas, target, title, out / "replay.png")
    print(f"target {target:g} (nats per sample)")
    hdr = ("tracking_error", "overshoot", "settling_time", "time_at_bounds")
    print(f"{'controller':<42}" + "".join(f"{h:>16}" for h in hdr) + f"{'final beta':>12}")
    for label, m in rows:
        vals = "".join(f"{'-' if m[h] is None else format(m[h], '.3g'):>16}" for h in hdr)
        print(f"{label:<42}{vals}{betas[label][-1]:>12.4g}")
    if not args.closed_loop:
        print("(open loop: the trace does not react to these betas; metrics describe the trace)")
    print(f"wrote {out / 'replay.csv'} and {png}")
    return 0
