"""``klppo train``: presets and YAML supply defaults, tyro flags override them."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

USAGE = """klppo train [--preset NAME] [--config FILE.yaml] [FLAGS...]
       klppo train --resume RUN_DIR

Presets: klip/cartpole, klip/lunarlander, klip/halfcheetah, klip/hopper, klip/walker2d,
klip/ant, klip/humanoid. Every flag of the config is listed by `klppo train --help`."""


class Progress:
    """A progress bar on a terminal, periodic log lines otherwise."""

    def __init__(self, total: int, start: int = 0) -> None:
        self.total = total
        self.tty = sys.stdout.isatty()
        self.every = max(1, total // 20)
        self.t0 = time.perf_counter()
        self.start = start

    def __call__(self, m: dict[str, Any]) -> None:
        it = m["iteration"]
        ret = m.get("episode_return_mean")
        ret_s = "     -" if ret is None else f"{ret:8.1f}"
        line = (f"iter {it:>5}/{self.total}  step {m['global_step']:>9,}  return {ret_s}  "
                f"kl {m['kl_rollout']:.4f}  kill {m.get('frac_kill', math.nan):.3f}  "
                f"beta {m['beta']:.4g}  {m['sps']:,.0f} steps/s")
        if self.tty:
            width = 24
            done = int(width * it / self.total)
            sys.stdout.write("\r[" + "#" * done + "." * (width - done) + "] " + line)
            sys.stdout.flush()
            if it == self.total:
                sys.stdout.write("\n")
        elif it % self.every == 0 or it == self.total or it == self.start + 1:
            print(line, flush=True)


def _load_base(known: argparse.Namespace):
    from pathlib import Path

    from klppo.rl import config as C
    from klppo.runs import rundir as R

    base = C.preset(known.preset) if known.preset else C.TrainConfig()
    if known.config:
        path = Path(known.config)
        data = R.read_yaml(path, "config")
        base = C.from_dict({} if data is None else data, base, source=str(path))  # empty: none
    return base


def _errors() -> tuple[type[BaseException], ...]:
    """Everything a user's input or a failed run raises: printed as one line."""
    from klppo.rl import config as C
    from klppo.rl.envs import EnvError
    from klppo.rl.trainer import ResumeError, TrainingError
    from klppo.runs import rundir as R
    from klppo.runs.checkpoint import CheckpointError
    from klppo.runs.configfile import InputError

    return (C.ConfigError, InputError, R.DirBusyError, CheckpointError, EnvError,
            ResumeError, TrainingError, ImportError, OSError, ValueError)


def run_train(argv: list[str]) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset")
    pre.add_argument("--config")
    pre.add_argument("--resume")
    known, rest = pre.parse_known_args(argv)
    if known.resume is not None:
        if rest or known.preset or known.config:
            print("klppo train: --resume takes no other flags (the run's config.yaml is used)",
                  file=sys.stderr)
            return 2
        return _resume(known.resume)
    try:
        base = _load_base(known)
    except _errors() as e:
        print(f"klppo train: {e}", file=sys.stderr)
        return 2
    cfg = _parse_flags(base, rest)
    if cfg is None:
        return 2
    from klppo.rl.trainer import TrainingError, train

    try:
        result = train(cfg, on_iteration=Progress(cfg.num_iterations))
    except TrainingError as e:
        print(f"klppo train: {e}", file=sys.stderr)
        return 1
    except _errors() as e:
        print(f"klppo train: {e}", file=sys.stderr)
        return 2
    return _report(result)


def _parse_flags(base, rest: list[str]):
    """tyro's flags over ``base``, validated; None (after one line on stderr) when they are bad."""
    from klppo import cli_common
    from klppo.rl import config as C

    try:
        cfg = cli_common.parse_config_flags(C.TrainConfig, rest, "klppo train", base, USAGE)
        return C.validate(cfg)
    except (cli_common.FlagError, C.ConfigError) as e:
        print(f"klppo train: {e}", file=sys.stderr)
        return None


def _resume(run_dir: str) -> int:
    from klppo.rl.trainer import TrainingError, read_run_config, resume

    try:
        cfg = read_run_config(run_dir)
        result = resume(run_dir, on_iteration=Progress(cfg.num_iterations))
    except TrainingError as e:
        print(f"klppo train: {e}", file=sys.stderr)
        return 1
    except _errors() as e:
        print(f"klppo train: {e}", file=sys.stderr)
        return 2
    return _report(result)


def _report(result) -> int:
    print(f"run directory: {result.run_dir}")
    print(f"status: {result.status}; final return (last 10% of steps): {result.final_return:.2f}")
    return 0 if result.status in ("finished", "interrupted") else 1
