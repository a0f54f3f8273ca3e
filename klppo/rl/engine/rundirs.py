"""``train_group(run_dirs)`` / ``train_batched(configs)``: many runs trained in one process.

Each run is an ordinary trainer (:class:`klppo.rl.trainer`'s single-agent one, or a multi-agent
:class:`~klppo.rl.marl.trainer.MultiTrainer`) whose policies are rows of the group's stacks
(:class:`~klppo.rl.engine.groups.StackSet`); one iteration of every run is computed together by
the group (:class:`~klppo.rl.engine.group.Group`). Each run's directory is written by the shared
lifecycle (:func:`klppo.runs.loop.run_group`): config.yaml, metrics.jsonl, checkpoint.pt,
status.json, metadata.json as a run alone writes them, so ``klppo report``, ``replay``, ``eval``,
``klppo.load`` and ``klppo train --resume`` read them unchanged, and a run may be resumed in any
grouping.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from klppo.rl.config import TrainConfig
from klppo.rl.config_checks import validate
from klppo.rl.engine.group import Group
from klppo.rl.engine.groups import StackSet, check_group, stack_keys
from klppo.rl.envs import check_env
from klppo.rl.lifecycle import read_run_config
from klppo.rl.marl.spec import check_multiagent, is_multiagent
from klppo.rl.opening import TrainResult, open_existing, open_new, sinks
from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.errors import RunFailed, UserInputError
from klppo.runs.lifecycle import OnIteration, RunLife
from klppo.runs.loop import run_group
from klppo.runs.threads import compute_threads

log = logging.getLogger(__name__)

__all__ = ["train_group", "train_batched"]

Opened = list[tuple[int, Any, RunLife]]


def _meta(runs: int) -> dict[str, Any]:
    return {"engine": {"name": "group", "runs": runs}}


def _makers(stacks: StackSet, member: int) -> Any:
    return lambda name, cfg: stacks.maker(member, name, cfg)


def _run(opened: Opened, on_iteration: OnIteration) -> dict[int, tuple[str, str | None]]:
    """Iterate the opened runs ``(index, trainer, life)`` together; each index's end state and
    error."""
    if not opened:
        return {}
    trainers = [tr for _, tr, _ in opened]
    group = Group(trainers)
    states, errors = run_group(trainers, [life for _, _, life in opened], group.iterate,
                               lambda i: M.MetricsWriter(sinks(trainers[i].cfg,
                                                                opened[i][2].run_dir)),
                               on_iteration)
    return {r: (s, e) for (r, _, _), s, e in zip(opened, states, errors)}


def _results(dirs: list[Path], ends: dict[int, tuple[str, str | None]]) -> list[TrainResult]:
    out = []
    for r, d in enumerate(dirs):
        records = M.read_metrics(d / "metrics.jsonl")[0] if (d / "metrics.jsonl").exists() else []
        out.append(TrainResult(d, records, ends.get(r, ("failed", None))[0]))
    return out


def _abandon(opened: Opened) -> None:
    """Close and unlock the runs opened before the start of the group failed."""
    for _, tr, life in opened:
        try:
            tr.close()
        finally:
            life.lock.release()


def train_group(run_dirs: list[str | Path], on_iteration: OnIteration = None
                ) -> list[TrainResult]:
    """Train (or resume, or skip when finished) the runs whose directories hold their
    ``config.yaml`` together in this process; one :class:`TrainResult` per directory, in order
    (status 'failed' for a run that failed or could not start: its status.json says why). The
    runs must be able to share a group (:func:`~klppo.rl.engine.groups.check_group`: a one-line
    ConfigError before any run is touched). A run that cannot start (an unreadable config, a
    damaged checkpoint) is left failed and the others train; a directory another process holds
    is not touched, and :class:`~klppo.runs.rundir.DirBusyError` names it after the others."""
    dirs = [Path(d) for d in run_dirs]
    configs: dict[int, TrainConfig] = {}
    for r, d in enumerate(dirs):
        try:
            configs[r] = read_run_config(d)
        except UserInputError as e:  # as a worker of its own would end: failed, named
            R.write_status(d, "failed", error=str(e), iteration=0)
            log.warning("%s", e)
    if not configs:
        return _results(dirs, {})
    plan = {r: stack_keys(c) for r, c in configs.items()}
    check_group(list(configs.values()), [str(dirs[r]) for r in configs], list(plan.values()))
    stacks = StackSet(list(plan.values()))
    member = {r: m for m, r in enumerate(configs)}
    opened: Opened = []
    busy: list[R.DirBusyError] = []
    with compute_threads(next(iter(configs.values())).torch_threads) as threads:
        try:
            for r, cfg in configs.items():
                try:
                    tr, life, _ = open_existing(dirs[r], cfg, threads,
                                                _makers(stacks, member[r]), _meta(len(dirs)))
                except R.DirBusyError as e:  # another process's run: not ours to touch
                    busy.append(e)
                    continue
                except (RunFailed, UserInputError) as e:  # its status.json says why
                    log.warning("%s", e)
                    continue
                opened.append((r, tr, life))
        except BaseException:
            _abandon(opened)
            raise
        results = _results(dirs, _run(opened, on_iteration))
    if busy:
        raise busy[0]
    return results


def _check_new(c: TrainConfig) -> None:
    """The checks :func:`klppo.rl.train` makes before a directory exists."""
    validate(c)
    if is_multiagent(c.env):
        check_multiagent(c)
    else:
        check_env(c.env, c.env_kwargs, c.objective, c.rollout.env_backend)
    if c.track == "wandb":
        M.require_wandb()


def train_batched(configs: list[TrainConfig], on_iteration: OnIteration = None
                  ) -> list[TrainResult]:
    """Train new runs (each into ``config.out`` or a default directory, as :func:`klppo.rl.train`
    names it) together in this process; every check runs before any directory is made."""
    for c in configs:
        _check_new(c)
    plan = [stack_keys(c) for c in configs]
    check_group(configs, [f"run {i} ({c.env}, {c.objective}, seed {c.seed})"
                          for i, c in enumerate(configs)], plan)
    stacks = StackSet(plan)
    opened: Opened = []
    with compute_threads(configs[0].torch_threads) as threads:
        try:
            for r, cfg in enumerate(configs):
                tr, life = open_new(cfg, threads, _makers(stacks, r), _meta(len(configs)))
                opened.append((r, tr, life))
        except BaseException:
            _abandon(opened)
            raise
        return _results([life.run_dir for _, _, life in opened], _run(opened, on_iteration))
