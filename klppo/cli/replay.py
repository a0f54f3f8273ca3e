"""``klppo replay``: the controller lab on the command line."""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from klppo.cli.errors import REPORTED, FlagError, fail, say_error
from klppo.cli.flags import path_arg
from klppo.cli.progress import NumericWarnings
from klppo.runs.errors import InputError

DESCRIPTION = ("The controller lab: replay a logged KL trace (a run directory, its "
               "metrics.jsonl, or a CSV file) through beta controllers, open loop, or simulate "
               "how the KL responds to beta (--closed-loop). Writes OUT/replay.csv and "
               "OUT/replay.png and prints each controller's metrics: how its beta responded "
               "(open loop) or how its KL tracked the target (closed loop). A named step preset "
               "keeps its own target unless the spec sets target=.")


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="feed a KL trace (or a simulated plant) to controllers",
                       description=DESCRIPTION)
    p.add_argument("trace", nargs="?", help="a run directory, its metrics.jsonl, or a CSV file")
    p.add_argument("--column", help="trace column (default kl_observed / kl_rollout / kl)")
    p.add_argument("--policy", metavar="NAME",
                   help="a multi-agent run's policy: replay its trace (its NAME/ columns and "
                        "NAME/kl_target); required for a multi-agent run")
    p.add_argument("--target", type=float,
                   help="target KL in the run's unit (nats per sample for a klppo train run; "
                        "default: the run's, else 0.02); a named step preset "
                        "(step:preset=rllib) keeps its own unless its spec sets target=")
    p.add_argument("--controller", nargs="+", metavar="SPEC",
                   help="e.g. step:preset=rllib proportional:beta=1,horizon=10 (default: one "
                        "of each rule)")
    p.add_argument("--closed-loop", action="store_true",
                   help="simulate the KL response to beta instead of replaying a trace")
    for flag, kind, default, what in _CLOSED_LOOP_FLAGS:
        p.add_argument(flag, type=kind, help=f"{what} (default {default}; --closed-loop only)")
    p.add_argument("--out", type=path_arg, default="replay",
                   help="directory for replay.csv and replay.png (created; default ./replay; "
                        "an earlier replay there is refused without --force)")
    p.add_argument("--force", action="store_true",
                   help="overwrite replay.csv and replay.png of an earlier replay in --out")
    p.set_defaults(func=cmd_replay)


#: what a replay writes into --out
OUTPUTS = ("replay.csv", "replay.png")


def _check_out(out: str, force: bool) -> None:
    """FlagError when --out holds an earlier replay's files and --force is not given."""
    found = [n for n in OUTPUTS if (Path(out) / n).exists()]
    if found and not force:
        raise _bad("--out", out, f"holds an earlier replay ({', '.join(found)}); pass --force "
                                 "to overwrite it, or choose another --out")


#: the simulated plant's flags: (flag, type, default, help)
_CLOSED_LOOP_FLAGS = [("--steps", int, 200, "closed-loop updates"),
                      ("--seed", int, 0, "closed-loop noise seed"),
                      ("--drift", float, 1.0, "plant: log-drift over the run"),
                      ("--noise", float, 0.3, "plant: lognormal noise sigma")]

#: the most closed-loop updates (each controller's loop runs in Python)
STEPS_MAX = 100_000


def _bad(flag: str, value, why: str) -> FlagError:
    return FlagError(f"{flag}={value!r}: {why}")


def _check_plant_flags(args: argparse.Namespace) -> None:
    """The closed-loop flags: refused with a trace, else set (defaults) and checked."""
    from klppo.replay.lab import Plant

    for flag, _, default, _ in _CLOSED_LOOP_FLAGS:
        name = flag[2:]
        if getattr(args, name) is not None and not args.closed_loop:
            raise _bad(flag, getattr(args, name), "only used with --closed-loop (a trace "
                                                  "is replayed as it was logged)")
        if getattr(args, name) is None:
            setattr(args, name, default)
    if not 1 <= args.steps <= STEPS_MAX:
        raise _bad("--steps", args.steps, f"must be an integer >= 1 and <= {STEPS_MAX:,}")
    if not 0 <= args.seed < 2**32:
        raise _bad("--seed", args.seed, "must be an integer in [0, 2**32)")
    if not (math.isfinite(args.drift) and abs(args.drift) <= Plant.DRIFT_MAX):
        raise _bad("--drift", args.drift, f"must be finite and within +-{Plant.DRIFT_MAX:g} "
                                          "(the log-change of the KL over the run)")
    if not (math.isfinite(args.noise) and 0 <= args.noise <= Plant.NOISE_MAX):
        raise _bad("--noise", args.noise, f"must be finite, >= 0 and <= {Plant.NOISE_MAX:g} "
                                          "(a lognormal sigma)")


def _check_flags(args: argparse.Namespace) -> None:
    """The numeric flags and the trace / --closed-loop choice; FlagError naming the flag."""
    _check_plant_flags(args)
    if args.target is not None and not (math.isfinite(args.target) and args.target > 0):
        raise _bad("--target", args.target, "must be finite and > 0")
    if args.column is not None and not args.column.strip():
        raise _bad("--column", args.column, "must name a column")
    if args.policy is not None and not args.policy.strip():
        raise _bad("--policy", args.policy, "must name a policy")
    if args.policy is not None and args.closed_loop:
        raise _bad("--policy", args.policy, "not used with --closed-loop (it picks a policy of "
                                           "a multi-agent run's trace)")
    if args.closed_loop and args.trace:
        raise _bad("trace", args.trace, "not used with --closed-loop (give one or the other)")
    if not args.closed_loop and not args.trace:
        raise _bad("trace", None, "give a trace (run directory, metrics.jsonl or CSV), or "
                                 "--closed-loop")
    specs = args.controller or []
    dup = next((x for i, x in enumerate(specs) if x in specs[:i]), None)
    if dup is not None:
        raise _bad("--controller", dup, "given twice")


def _inputs(args: argparse.Namespace):
    """``(steps, kl or None, target, controllers)`` from the flags and the trace file."""
    from klppo.replay.lab import default_controllers, load_trace, parse_controller
    from klppo.runs.owned import owned_reason
    from klppo.runs.paths import check_writable

    _check_flags(args)
    reason = owned_reason(args.out, OUTPUTS, "--out")
    if reason is not None:  # a run's or sweep's file: never, --force or not
        raise FlagError(reason)
    check_writable(args.out)
    _check_out(args.out, args.force)
    steps: list[float]
    kl: list[float] | None
    if args.closed_loop:
        target = args.target or 0.02
        steps, kl = list(range(args.steps)), None
    else:
        steps, kl, run_target = load_trace(args.trace, args.column, args.policy)
        target = args.target or run_target or 0.02
        if not (math.isfinite(target) and target > 0):
            key = "kl_target" if args.policy is None else f"{args.policy}/kl_target"
            raise InputError(f"trace={args.trace!r}: {key}={target!r} must be finite and "
                             f"> 0 (or pass --target)")
    specs = args.controller or default_controllers(target)
    return steps, kl, target, dict(parse_controller(s, target) for s in specs)


def _compute(args: argparse.Namespace, kl, target, ctrls):
    """``(kls, betas, rows, title, xlabel)``: the loops run, nothing written yet. ``rows``:
    (label, metrics) per controller: tracking metrics closed loop, response metrics open loop
    (:func:`klppo.replay.lab.response_metrics`)."""
    from klppo.replay.lab import Plant, closed_loop, open_loop, response_metrics, trace_x_label

    if args.closed_loop:
        plant = Plant(drift=args.drift, noise=args.noise, seed=args.seed)
        results = [closed_loop(label, c, plant, args.steps) for label, c in ctrls.items()]
        title = f"closed loop: simulated plant (drift {args.drift:g}, noise {args.noise:g})"
        return ({r.label: r.kl for r in results}, {r.label: r.beta for r in results},
                [(r.label, r.metrics) for r in results], title,
                "controller update (one per simulated iteration)")
    initial = {label: c.value for label, c in ctrls.items()}
    betas = open_loop(kl, ctrls)
    rows = [(label, response_metrics(kl, [initial[label], *b], ctrls[label].target,
                                     ctrls[label].beta_min, ctrls[label].beta_max))
            for label, b in betas.items()]
    title = f"open loop: {args.trace}" + (
        f", policy {args.policy}" if args.policy is not None else "")
    return {"trace": kl}, betas, rows, title, trace_x_label(args.trace)


#: the columns printed per controller (metric key, header)
CLOSED_COLUMNS = [("tracking_error", "tracking_error"), ("overshoot", "overshoot"),
                  ("settling_time", "settling_time"), ("time_at_bounds", "time_at_bounds")]
OPEN_COLUMNS = [("moves", "moves"), ("right_way", "right_way"), ("reversals", "reversals/100"),
                ("decades", "beta_decades"), ("time_at_bounds", "time_at_bounds")]


def _print_table(rows, betas, ctrls, columns) -> None:
    print(f"{'controller':<42}{'target':>9}" + "".join(f"{h:>15}" for _, h in columns)
          + f"{'final beta':>12}")
    for label, m in rows:
        vals = "".join(f"{'-' if m[k] is None else format(m[k], '.3g'):>15}" for k, _ in columns)
        t = ctrls[label].target
        print(f"{label:<42}{'-' if t is None else format(t, 'g'):>9}{vals}"
              f"{betas[label][-1]:>12.4g}")


def _print_trace(kl, ctrls) -> None:
    """Open loop: the trace's own tracking of each distinct target (not the controllers')."""
    from klppo.replay.lab import FLOOR, tracking_metrics

    for t in sorted({c.target for c in ctrls.values() if c.target is not None}):
        m = tracking_metrics(kl, [], t, 0.0, 0.0)
        vals = ", ".join(f"{k} {'-' if m[k] is None else format(m[k], '.3g')}"
                         for k in ("tracking_error", "overshoot", "settling_time"))
        print(f"the trace against target {t:g}: {vals}")
        low = sum(1 for d in kl if d <= FLOOR * t)
        if low:
            print(f"note: {low} of {len(kl)} KL values are below {FLOOR:g} x the target {t:g} "
                  f"(a noisy estimate can be 0 or negative): the tracking error counts them as "
                  f"{FLOOR:g} x the target")
    print("(open loop: the trace does not react to these betas; the table says how each "
          "controller's beta answered it: moves = share of updates that changed beta, "
          "right_way = share of those that corrected the error, reversals per 100 updates, "
          "decades of beta swept)")


def cmd_replay(args: argparse.Namespace) -> int:
    from klppo.replay.lab import preset_keeps_target
    from klppo.replay.plots import plot_lab

    try:
        steps, kl, target, ctrls = _inputs(args)
        kls, betas, rows, title, xlabel = _compute(args, kl, target, ctrls)
    except REPORTED as e:
        return fail("replay", e)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "replay.csv", "w", newline="") as f:
        w = csv.writer(f)
        labels = list(betas)
        w.writerow(["step", *(f"kl[{k}]" for k in kls), *(f"beta[{k}]" for k in labels)])
        for i, s in enumerate(steps):
            w.writerow([s, *(kls[k][i] for k in kls), *(betas[k][i] for k in labels)])
    targets = {label: c.target for label, c in ctrls.items()}
    with NumericWarnings() as numeric:  # extreme values overflow inside matplotlib's scaling
        png = plot_lab(steps, kls, betas, target, title, out / "replay.png", xlabel, targets)
    if numeric:
        say_error("replay", f"warning: the plot{numeric.suffix()}")
    who = f"policy {args.policy}: " if args.policy is not None else ""
    print(f"{who}target {target:g} (nats per sample)")
    for label, t in targets.items():
        if preset_keeps_target(label) and t != target:
            print(f"note: {label} keeps its preset's target {t:g}; add target={target:g} to "
                  "the spec to replay it at the replay's target")
    if args.closed_loop:
        _print_table(rows, betas, ctrls, CLOSED_COLUMNS)
    else:
        _print_table(rows, betas, ctrls, OPEN_COLUMNS)
        _print_trace(kl, ctrls)
    print(f"wrote {out / 'replay.csv'} and {png}")
    return 0
