"""``train(config) -> TrainResult``: the PPO loop in visible phases.

collect -> advantages -> update -> controller -> log -> checkpoint, once per iteration. The same
entry point serves the CLI, tests, notebooks and sweeps; ``resume(run_dir)`` continues a run from
its last checkpoint and reproduces the metrics of an uninterrupted run exactly. The run's trainer
is :class:`klppo.rl.single.SingleTrainer` (or the multi-agent one); opening its directory is
:mod:`klppo.rl.opening`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from klppo.rl.config import TrainConfig
from klppo.rl.config_checks import validate
from klppo.rl.envs import check_env
from klppo.rl.lifecycle import ResumeError, read_run_config
from klppo.rl.marl.spec import check_multiagent, is_multiagent
from klppo.rl.opening import TrainingError, TrainResult, open_existing, open_new, run_to_end
from klppo.rl.single import SingleTrainer
from klppo.runs import metrics as M
from klppo.runs.device import resolve_device
from klppo.runs.lifecycle import OnIteration
from klppo.runs.protocol import final_return
from klppo.runs.threads import compute_threads

__all__ = ["TrainResult", "TrainingError", "ResumeError", "train", "resume", "plan_resume",
           "final_return", "TIMING_KEYS"]

#: metrics that measure wall time; everything else is deterministic for a given seed.
TIMING_KEYS = frozenset({"sps", "time_collect", "time_update", "time_elapsed"})

#: the single-agent trainer under its former name (tests and notebooks build it directly)
_Trainer = SingleTrainer


def train(config: TrainConfig, on_iteration: OnIteration = None,
          on_start: Callable[[], None] | None = None) -> TrainResult:
    """Train from scratch into a new run directory (``config.out`` or a default name).

    Every check (config, env, extras, the output path) runs before the directory is created;
    ``on_start`` is called once it is made, before the first iteration.
    """
    validate(config)
    if is_multiagent(config.env):  # the env, its agents and each policy's config
        check_multiagent(config)
    else:  # an unknown env or a missing extra fails before any directory exists
        check_env(config.env, config.env_kwargs, config.objective, config.rollout.env_backend)
    resolve_device(config.device)
    if config.track == "wandb":
        M.require_wandb()
    with compute_threads(config.torch_threads) as threads:
        tr, life = open_new(config, threads)
        if on_start is not None:
            on_start()
        return run_to_end(tr, life, on_iteration)


def resume(run_dir: str | Path, on_iteration: OnIteration = None,
           total_steps: int | None = None, lr_plan: str = "replan",
           on_start: Callable[[], None] | None = None) -> TrainResult:
    """Continue a run from its last checkpoint (or start it, if it never wrote one).

    ``total_steps`` sets a new total (to extend a finished run, or shorten an unfinished one
    to no fewer iterations than it has done): ``config.yaml`` and the checkpoint's config are
    rewritten with it, and with ``ppo.anneal_lr`` the learning rate of the iterations to come is
    planned by ``lr_plan``: ``replan`` (as a run planned for the new total from the start) or
    ``continue`` (on from the last iteration's rate; :func:`~klppo.rl.lifecycle.extend_config`);
    the resume in ``metadata.json`` records the old and new totals.

    Metrics written after the checkpoint are discarded and recomputed, so the finished
    metrics.jsonl equals that of an uninterrupted run (timing fields aside). The environments
    are restored exactly (:mod:`klppo.rl.vecenv`); where that is impossible the run goes on
    with new episodes and says so in the log and in ``status.json`` (``warnings``). The
    directory's config, checkpoint, metrics and metadata are checked against each other first
    (:func:`~klppo.rl.lifecycle.check_resume`); a mismatch is refused in one line.
    ``on_start`` is called once every check has passed and the checkpoint has loaded.
    """
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    resolve_device(cfg.device)
    with compute_threads(cfg.torch_threads) as threads:
        tr, life, kept = open_existing(run_dir, cfg, threads, total_steps=total_steps,
                                       lr_plan=lr_plan)
        if on_start is not None:
            on_start()
        if tr.iteration >= tr.num_iterations:
            tr.close()
            life.status("finished", tr.iteration)
            life.lock.release()
            return TrainResult(run_dir, kept, "finished")
        return run_to_end(tr, life, on_iteration)


def plan_resume(run_dir: str | Path, total_steps: int | None = None) -> TrainConfig:
    """The config a resume of ``run_dir`` (with a new ``total_steps``) runs for: its length and
    objective, for a progress display; the resume itself checks everything."""
    cfg = read_run_config(run_dir)
    if total_steps is None or total_steps == cfg.total_steps:
        return cfg
    return validate(dataclasses.replace(cfg, total_steps=total_steps))
