"""``klppo train``: presets and YAML supply defaults, tyro flags override them."""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

from klppo.cli.errors import (
    FAILED,
    REPORTED,
    FlagError,
    fail,
    say_error,
    signal_exit,
    stopped_at_once,
)
from klppo.cli.flags import Once, RaisingParser, name_arg, parse_config_flags, path_arg
from klppo.cli.progress import Bar, Closes, NumericWarnings, Part
from klppo.runs.errors import RunFailed

USAGE = """klppo train [--preset NAME] [--config FILE.yaml] [--env-kwargs MAPPING] [FLAGS...]
       klppo train --resume RUN_DIR [--total-steps N [--lr-plan replan|continue]]

Train PPO (any objective, any KL controller) on a Gymnasium or PettingZoo env into a run
directory: config.yaml, metrics.jsonl, checkpoints, TensorBoard events. Ctrl-C or SIGTERM
finishes the iteration, checkpoints, prints the resume command and exits 130 (143).

Where the defaults come from (the config flags below override them):
  --preset NAME       start from a preset: klip/cartpole, klip/lunarlander, klip/halfcheetah,
                      klip/hopper, klip/walker2d, klip/ant, klip/humanoid (MuJoCo v4, the
                      paper's); klip/halfcheetah-v5, klip/hopper-v5, klip/walker2d-v5,
                      klip/ant-v5, klip/humanoid-v5 (the same settings on MuJoCo v5);
                      marl/simple_adversary, marl/simple_adversary_continuous (multi-agent)
  --config FILE.yaml  a YAML mapping of config fields, over the preset (e.g. examples/my.yaml)
  --env-kwargs MAPPING
                      keyword arguments of gym.make for the env, a YAML or JSON mapping, e.g.
                      '{continuous: true}' (recorded in config.yaml as env_kwargs)
  --resume RUN_DIR    continue a run from its last checkpoint (its config.yaml; no other flags
                      but --total-steps N, which sets a new total, and --lr-plan: with an
                      annealed learning rate, replan (the default) gives the iterations to come
                      the rates of a run planned for the new total, continue goes on from the
                      last rate, which at the end of a finished run is about lr / iterations)"""


class Progress(Closes):
    """``klppo train``'s progress (:class:`~klppo.cli.progress.Bar`): iteration, return, KL,
    kill fraction, beta, steps/s and ETA; at a narrow terminal the least important fields go
    first (the step count, the elapsed time, the bar, then the KL). ``uses_beta`` False (an
    objective without a controller beta) shows ``beta -``."""

    def __init__(self, total: int, uses_beta: bool = True, file=None,
                 now=time.perf_counter, header: list[str] | None = None) -> None:
        self.total = total
        self.uses_beta = uses_beta
        self.bar = Bar(total, file=file, now=now)
        self.eval: float | None = None  # the last evaluation's return (eval_every)
        #: lines printed by :meth:`start`, once the run has passed every check (a refusal is
        #: then the only line of a command that does not start)
        self.header = list(header or [])

    def parts(self, m: dict[str, Any]) -> list[Part]:
        it, n = m["iteration"], self.total
        head = [Part.of(10, f"iter {it:>{len(str(n))}}/{n}", f"{it}/{n}", shorten=4),
                Part.of(2, f"step {m['global_step']:,}")]
        tail = [Part.of(8, f"{m['sps']:,.0f} steps/s")]
        policies = [k[:-len("/kl_rollout")] for k in m if k.endswith("/kl_rollout")]
        if policies:  # a multi-agent run: return, KL and beta per policy
            return head + [self._policy(m, p) for p in policies] + tail
        ret = m.get("episode_return_mean")
        ret_s = "-" if ret is None else f"{ret:.1f}"
        beta = f"{m['beta']:.4g}" if self.uses_beta else "-"
        self.eval = m.get("eval_return_mean", self.eval)
        evaluated = [] if self.eval is None else [Part.of(6, f"eval {self.eval:.1f}")]
        return head + [Part.of(6, f"return {ret_s}", f"ret {ret_s}", shorten=4), *evaluated,
                       Part.of(5, f"kl {m['kl_rollout']:.4f} nats"),
                       Part.of(7, f"kill {m.get('frac_kill', math.nan):.3f}"),
                       Part.of(7, f"beta {beta}")] + tail

    @staticmethod
    def _policy(m: dict[str, Any], p: str) -> Part:
        ret = _num(m.get(f"{p}/episode_return_mean"), ".1f")
        kl, beta = f"kl {m[f'{p}/kl_rollout']:.4f} nats", f"beta {m[f'{p}/beta']:.4g}"
        return Part.of(6, f"{p}: return {ret} {kl} {beta}", f"{p}: ret {ret} {beta}",
                       f"{p}: {beta}", shorten=4)

    def line(self, m: dict[str, Any]) -> str:
        """The full line of ``m`` (what a log file gets), without the times."""
        return "  ".join(p.forms[0] for p in self.parts(m))

    def start(self) -> None:
        """The run has passed every check and opened its directory: the header lines."""
        for text in self.header:
            self.bar.print(text)
        self.header = []

    def __call__(self, m: dict[str, Any]) -> None:
        self.start()  # (already printed, unless the run was started without on_start)
        self.bar.update(m["iteration"], self.parts(m))

    def print(self, text: str) -> None:
        self.bar.print(text)

    def close(self) -> None:
        self.bar.close()



def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def announce_rounding(cfg) -> str | None:
    """One line when ``total_steps`` is not a whole number of rollouts (the run does
    ``num_iterations`` full rollouts), else None."""
    if cfg.total_steps % cfg.batch_size == 0:
        return None
    n = cfg.num_iterations
    return (f"note: total_steps {cfg.total_steps:,} is not a multiple of num_envs * num_steps = "
            f"{cfg.batch_size:,}: the run will do {n:,} iterations = {n * cfg.batch_size:,} steps")


def _progress(cfg, header: tuple[str, ...] = ()) -> Progress:
    """The progress display of ``cfg``'s run; ``header`` and the rounding note come when the run
    starts (after every check, so a refusal stays one line)."""
    from klppo.core.objectives import OBJECTIVES

    note = announce_rounding(cfg)
    return Progress(cfg.num_iterations, uses_beta=OBJECTIVES[cfg.objective].uses_beta,
                    header=[*header, *([note] if note is not None else [])])


def _load_base(known: argparse.Namespace):
    from pathlib import Path

    from klppo.rl import config as C
    from klppo.rl.presets import preset
    from klppo.runs import rundir as R

    base = preset(known.preset) if known.preset else C.TrainConfig()
    if known.config:
        path = Path(known.config)
        data = R.read_yaml(path, "config")
        base = C.from_dict({} if data is None else data, base, source=str(path))  # empty: none
    return base


#: what ``klppo train`` reports in one line: klppo's errors, file problems, bad values, and a
#: missing optional extra (``track=wandb`` without wandb)
_REPORTED: tuple[type[BaseException], ...] = (*REPORTED, ImportError)


def parse_train(argv: list[str]):
    """What ``klppo train ARGV`` would run, without running it: the validated ``TrainConfig``,
    or the run directory (a ``str``) of ``--resume`` (a :class:`Resume` with
    ``--total-steps``). Bad input raises a
    :class:`~klppo.runs.errors.UserInputError` (or ``OSError``, ``ValueError``) with the
    one-line message the command prints; ``--help`` exits 0."""
    from klppo.rl import config as C

    pre = RaisingParser(prog="klppo train", add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", type=name_arg, action=Once)
    pre.add_argument("--config", type=path_arg, action=Once)
    pre.add_argument("--resume", type=path_arg, action=Once)
    pre.add_argument("--env-kwargs", "--env_kwargs", dest="env_kwargs", action=Once)
    known, rest = pre.parse_known_args(argv)
    if known.resume is not None:
        return _resume_request(known, rest)
    base = _load_base(known)
    if known.env_kwargs is not None:
        base = C.from_dict({"env_kwargs": _mapping(known.env_kwargs)}, base)
    cfg = parse_config_flags(C.TrainConfig, rest, "klppo train", base, USAGE)  # --help exits
    from klppo.rl.config_checks import validate
    from klppo.runs.owned import inside_owned

    cfg = validate(cfg)
    reason = inside_owned(cfg.out) if cfg.out else None
    if reason is not None:
        raise C.ConfigError(reason)
    return cfg


def _mapping(text: str) -> dict:
    """``--env-kwargs``' value: a YAML (or JSON) mapping."""
    from klppo.cli.flags import yaml_value

    value = yaml_value(text, f"--env-kwargs={text!r}")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FlagError(f"--env-kwargs={text!r}: must be a mapping, e.g. '{{continuous: true}}'")
    return value


def _resume_request(known: argparse.Namespace, rest: list[str]) -> str | Resume:
    """``--resume DIR`` alone (the directory), or with ``--total-steps N`` (a :class:`Resume`
    that sets the run's new total)."""
    pre = RaisingParser(prog="klppo train", add_help=False, allow_abbrev=False)
    pre.add_argument("--total-steps", "--total_steps", dest="total_steps", type=int,
                     action=Once)
    pre.add_argument("--lr-plan", "--lr_plan", dest="lr_plan", choices=("replan", "continue"),
                     action=Once)
    steps, other = pre.parse_known_args(rest)
    if other or known.preset or known.config or known.env_kwargs is not None:
        raise FlagError("--resume takes no other flags but --total-steps N [--lr-plan "
                        "replan|continue] (the run's config.yaml is used)")
    if steps.total_steps is None:
        if steps.lr_plan is not None:
            raise FlagError(f"--lr-plan {steps.lr_plan}: only a new --total-steps reads it")
        return known.resume
    return Resume(known.resume, steps.total_steps, steps.lr_plan or "replan")


@dataclass(frozen=True)
class Resume:
    """``klppo train --resume RUN_DIR --total-steps N``: continue the run to a new total."""

    run_dir: str
    total_steps: int
    lr_plan: str = "replan"


def run(argv: list[str]) -> int:
    """``klppo train ARGV``: 0 when the run finished, 1 when it failed, 2 on bad input, 128 +
    the signal (130 SIGINT, 143 SIGTERM) when a signal stopped it (it resumes with ``klppo
    train --resume RUN_DIR``, which is printed)."""
    numeric = NumericWarnings()
    try:
        cfg = parse_train(argv)
        with numeric:
            result = _start(cfg)
    except RunFailed as e:
        say_error("train", f"{e}{numeric.suffix()}")
        return FAILED
    except _REPORTED as e:
        return fail("train", e)
    except KeyboardInterrupt as e:
        return stopped_at_once("train", e)
    return _report(result, numeric)


def _start(cfg):
    """Train ``cfg`` (a ``TrainConfig``), or resume the run directory ``cfg`` (a ``str``, or a
    :class:`Resume` with a new total)."""
    from klppo.rl.trainer import plan_resume, resume, train

    if isinstance(cfg, (str, Resume)):
        run_dir, total, lr_plan = (cfg, None, "replan") if isinstance(cfg, str) else \
            (cfg.run_dir, cfg.total_steps, cfg.lr_plan)
        plan = plan_resume(run_dir, total)
        with _progress(plan, (_resuming(run_dir, plan.num_iterations),)) as progress:
            return resume(run_dir, on_iteration=progress, total_steps=total, lr_plan=lr_plan,
                          on_start=progress.start)
    with _progress(cfg) as progress:
        return train(cfg, on_iteration=progress, on_start=progress.start)


def _resuming(run_dir: str, iterations: int) -> str:
    """``resuming RUN from iteration K of N`` (K: the checkpoint's own; ``status.json`` may be
    older: a killed run's says where it started)."""
    from pathlib import Path

    from klppo.runs import checkpoint as ckpt

    done: object = 0
    if (Path(run_dir) / ckpt.CHECKPOINT).exists():
        try:
            done = ckpt.load_checkpoint(Path(run_dir)).get("iteration")
        except Exception:  # noqa: BLE001 - the resume itself names a damaged checkpoint
            done = None
    at = f"iteration {done:,}" if isinstance(done, int) and done >= 0 else "its checkpoint"
    return f"resuming {run_dir} from {at} of {iterations:,}"


def _report(result, numeric: NumericWarnings) -> int:
    if numeric:
        print(f"klppo train: warning:{numeric.suffix()}", file=sys.stderr)
    print(f"run directory: {result.run_dir}")
    per_policy = result.final_returns()
    if result.status == "interrupted":  # no final return: the run is not finished
        print("status: interrupted (not finished: its return so far is in metrics.jsonl)")
    elif per_policy:
        text = ", ".join(f"{p} {r:.2f}" for p, r in per_policy.items())
        print(f"status: {result.status}; final return per policy (last 10% of steps): {text}")
    else:
        print(f"status: {result.status}; final return (last 10% of steps): "
              f"{result.final_return:.2f}")
    if result.status == "interrupted":
        import signal

        sig = signal.Signals(result.stop_signal or signal.SIGINT).name
        done = result.metrics[-1]["iteration"] if result.metrics else 0
        print(f"stopped by {sig} after iteration {done:,} (checkpointed); resume with: "
              f"klppo train --resume {result.run_dir}", flush=True)
        return signal_exit(result.stop_signal)
    return 0 if result.status == "finished" else 1
