"""``klppo tune``: an Optuna study over training runs (TPE sampler, median pruning on the
final-return protocol), resumable, each trial an ordinary run directory."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import textwrap

from klppo.cli.errors import REPORTED, fail, signal_exit, stopped_at_once
from klppo.cli.flags import Once, int_in, path_arg
from klppo.cli.progress import Bar, Part, clock
from klppo.runs.install import install_hint

DESCRIPTION = (
    "Tune a training config with Optuna: the search space (YAML, like a sweep spec: preset, "
    "base, space, seeds, trials, sampler, pruner) is sampled by TPE, each trial trains one run "
    "directory per seed under OUT/runs/ and is scored by the final return (the mean return of "
    "the episodes that ended in the last 10% of its steps); the median pruner stops trials "
    f"that fall behind. Needs the tune extra: {install_hint('tune')}.")

EPILOG = (
    "The study is kept in OUT/study.journal (Optuna's journal: JSON lines). Run the same "
    "command again to continue it (--trials N to extend it): a trial that Ctrl-C, SIGTERM or a "
    "crash stopped resumes its run from the last checkpoint. OUT/best_config.yaml holds the "
    "best trial's config (klppo train --config OUT/best_config.yaml); klppo report OUT draws "
    "every trial. Exit codes: 0 at least one trial completed, 1 none did, 2 bad input, "
    "130 / 143 stopped by SIGINT / SIGTERM.")

SPEC_EXAMPLE = """example spec:
  preset: klip/cartpole
  base: {total_steps: 50000}
  space:
    ppo.lr: {low: 1.0e-4, high: 3.0e-3, log: true}
    ppo.update_epochs: {low: 2, high: 10}
    objective: {choices: [clip, per_sample_kl]}
  trials: 20"""


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="tune a config with Optuna (TPE, median pruning on the "
                                    "final return; needs the tune extra)",
                       description=textwrap.fill(DESCRIPTION, 88),
                       epilog=textwrap.fill(EPILOG, 88) + "\n\n" + SPEC_EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", type=path_arg, required=True, action=Once,
                   help="tuning spec YAML (preset, base, space, seeds, trials, sampler, "
                        "pruner, startup_trials, sampler_seed)")
    p.add_argument("--out", type=path_arg, required=True, action=Once,
                   help="tuning directory (running the same command again continues it)")
    p.add_argument("--trials", type=int_in(1, 10_000), action=Once, metavar="N",
                   help="trials of the study in all, instead of the spec's (more extends a "
                        "finished study)")
    p.set_defaults(func=cmd_tune)


class TuneProgress:
    """A line per trial (its state, value, values, the best so far, the ETA) and, on a
    terminal, a bar under them."""

    def __init__(self, total: int, done: int,
                 best: tuple[float, int] | None = None) -> None:
        self.total, self.done = total, done
        self.bar = Bar(max(1, total - done), every=1, eta_from_first=False)
        self.best = best  # (value, trial) of the earlier invocations', then of all
        self.seen = 0

    def __call__(self, t) -> None:
        self.done += 1
        self.seen += 1
        if t.state == "complete" and (self.best is None or t.value > self.best[0]):
            self.best = (t.value, t.number)
        eta = self.bar.eta
        eta.update(self.seen)
        left = eta.left
        value = f" {t.value:.2f}" if t.value is not None else ""
        why = f" ({t.error})" if t.error else ""
        values = "  ".join(f"{k}={_short(v)}" for k, v in t.params.items())
        best = "" if self.best is None else f", best {self.best[0]:.2f} (trial {self.best[1]})"
        self.bar.print(f"[trial {t.number} {self.done}/{self.total}] {t.state}{value}{why}  "
                       f"{values}  (tune at {clock(eta.elapsed)}{best}, ETA "
                       f"{'-' if left is None else clock(left)})")
        if self.bar.tty:
            self.bar.update(self.seen, [Part.of(10, f"trials {self.done}/{self.total}"),
                                        Part.of(6, best.removeprefix(", "))])

    def close(self) -> None:
        self.bar.close()


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _spec(args: argparse.Namespace):
    from klppo.experiments.tune_spec import load_tune_spec

    spec = load_tune_spec(args.spec)
    if args.trials is not None:
        spec = dataclasses.replace(spec, trials=args.trials).check()
    return spec


def cmd_tune(args: argparse.Namespace) -> int:
    from klppo.experiments.tune import require_optuna, run_tune

    try:
        spec = _spec(args)
        optuna = require_optuna()
    except REPORTED as e:
        return fail("tune", e)
    optuna.logging.disable_default_handler()  # klppo prints a line per trial itself
    optuna.logging.enable_propagation()
    logging.getLogger("optuna").setLevel(logging.WARNING)
    progress = TuneProgress(spec.trials, *_trials_so_far(args.out))
    try:
        notes = spec.invalid_draws()  # a space none of whose values is valid: refused here
        print(f"tune: {spec.trials} trials into {args.out} ({spec.sampler} sampler, "
              f"{spec.pruner} pruner, {len(spec.seeds)} run(s) per trial)", flush=True)
        for note in notes:
            print(f"tune: note: {note}", flush=True)
        res = run_tune(spec, args.out, on_trial=progress)
    except REPORTED as e:
        progress.close()
        return fail("tune", e)
    except KeyboardInterrupt as e:
        progress.close()
        return _interrupted(args, e)
    progress.close()
    return _summary(res, args)


def _trials_so_far(out: str) -> tuple[int, tuple[float, int] | None]:
    """The trials an earlier invocation finished and the best of them, ``(value, number)``
    (read from OUT/index.json; ``(0, None)`` when none)."""
    import json
    from pathlib import Path

    try:
        trials = json.loads((Path(out) / "index.json").read_text())["trials"]
        done = sum(t.get("state") in ("complete", "pruned", "fail", "invalid") for t in trials)
        best = max(((float(t["value"]), int(t["number"])) for t in trials
                    if t.get("state") == "complete" and isinstance(t.get("value"), (int, float))
                    and isinstance(t.get("number"), int)), key=lambda vn: vn[0], default=None)
        return done, best
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0, None


def _interrupted(args: argparse.Namespace, err: BaseException) -> int:
    code = stopped_at_once("tune", err)
    print(f"tune: stopped; run the same command again to continue ({args.out})", flush=True)
    return code


def _summary(res, args: argparse.Namespace) -> int:
    import signal

    counts: dict[str, int] = {}
    for t in res.trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    print("tune: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), flush=True)
    best = res.best
    if best is not None:
        values = " ".join(f"{k}={_short(v)}" for k, v in best.params.items())
        print(f"best: trial {best.number}, final return {best.value:.2f} with {values}")
        print(f"best config: {res.tune_dir / 'best_config.yaml'} (klppo train --config ...); "
              f"runs: {res.tune_dir / 'runs'}; klppo report {res.tune_dir} --out REPORT")
    if res.stop_signal is not None:
        print(f"tune: stopped by {signal.Signals(res.stop_signal).name}; run the same command "
              f"again to continue (the running trial resumes from its checkpoint)", flush=True)
        return signal_exit(res.stop_signal)
    if best is not None:
        return 0
    if res.trials and all(t.state == "invalid" for t in res.trials):
        print(f"tune: every trial was an invalid draw ({res.trials[-1].error}); narrow the "
              f"space", flush=True)
        return 2
    return 1
