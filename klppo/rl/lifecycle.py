"""The RL side of the run lifecycle (:mod:`klppo.runs.lifecycle`): reading a run directory's
config back, the checks of a resume against the config stored in the checkpoint, and what the
single- and multi-agent trainers share (:class:`RunTrainer`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from klppo.rl.config import ConfigError, TrainConfig, from_dict, to_dict
from klppo.rl.config_checks import validate
from klppo.rl.lr_schedule import lr_fraction
from klppo.runs import checkpoint as ckpt
from klppo.runs import rundir as R
from klppo.runs.errors import ResumeError
from klppo.runs.lifecycle import (
    check_config_unchanged,
    check_metrics,
    check_run_dir,
    metrics_records,
)
from klppo.runs.typecheck import short_repr

__all__ = ["RunTrainer", "ResumeError", "read_run_config", "check_resume", "extend_config",
           "write_extension", "RESUMABLE_CHANGES", "EXTENSION_FIELDS"]

#: config fields that may differ between a run's checkpoint and its ``config.yaml`` at a resume:
#: where files go, what is logged, how often to checkpoint, and where it computes (the device and
#: torch's threads may change the rounding, as another machine would; the resume is recorded).
RESUMABLE_CHANGES = frozenset({"out", "runs_root", "tensorboard", "track", "checkpoint_every",
                               "device", "torch_threads", "envpool_threads", "metric_names",
                               "wandb"})
#: fields a resume with a new total (``klppo train --resume DIR --total-steps N``) sets: the
#: total and where the learning-rate annealing goes on from (:func:`extend_config`)
EXTENSION_FIELDS = frozenset({"total_steps", "lr_anneal_from"})


class RunTrainer:
    """What the single- and multi-agent trainers share to run under
    :func:`klppo.runs.loop.run_iterations` (a run alone) or
    :func:`klppo.runs.loop.run_group` (runs together): the counters from the config, the
    divergence monitor, the checkpoint (with the config, which a resume checks), and the
    iteration itself, which the run's engine group computes (:class:`klppo.rl.engine.Group`: a
    run alone is a group of one). A subclass sets ``cfg``, ``env`` and ``monitor`` and
    implements ``state_dict`` and ``describe``, and what the group asks of a member
    (``start_iteration``, ``rollouts``, ``iteration_metrics``; ``collect`` unless it collects
    in lock step)."""

    cfg: TrainConfig
    env: Any
    monitor: Any
    iteration: int
    global_step: int
    #: the engine group the run iterates in, and its index there (set by the group)
    group: Any = None
    group_index: int = 0

    @property
    def num_iterations(self) -> int:
        return self.cfg.num_iterations

    @property
    def checkpoint_every(self) -> int:
        return self.cfg.checkpoint_every

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def iterate(self) -> dict[str, Any]:
        """One iteration computed by the run's group, with the wall time since the group
        started iterating (``time_elapsed``) and the run's steps per second (``sps``)."""
        m = self.group.iterate([self.group_index])[0]
        if isinstance(m, BaseException):
            raise m
        return m

    def collect_rollout(self, iteration: int) -> Any:
        """One rollout of this run alone through its group's collection (what an iteration
        collects; for tests and notebooks): what the group's collection gives the run (a
        single-agent run its episodes; a multi-agent run per policy its agent-episodes' returns,
        and the lengths of the episodes that ended)."""
        out = self.group.collect({self.group_index: self}, {self.group_index: iteration})
        res = out[self.group_index]
        if isinstance(res, BaseException):
            raise res
        return res

    def check(self, metrics: dict[str, Any]) -> list[str]:
        return self.monitor.check(metrics)

    def checkpoint(self, run_dir: Path) -> list[tuple[Path, bytes]]:
        return [ckpt.checkpoint_file(run_dir, {**self.state_dict(), "config": to_dict(self.cfg)})]

    def close(self) -> None:
        self.env.close()
        evaluator = getattr(self, "evaluator", None)
        if evaluator is not None:
            evaluator.close()


def read_run_config(run_dir: str | Path, what: str = "resume") -> TrainConfig:
    """The validated config of a run directory; one-line errors for a missing directory, a
    missing or malformed ``config.yaml`` or bad values in it (the directory named as
    ``what``, see :func:`~klppo.runs.lifecycle.check_run_dir`)."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir, "klppo train", what)
    path = run_dir / "config.yaml"
    cfg = from_dict(R.read_yaml(path), source=str(path))
    try:
        return validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _check_config(run_dir: Path, cfg: TrainConfig, saved: Any, extending: bool) -> None:
    """The checkpoint's config (written since klppo stored it there) must equal ``config.yaml``
    but for :data:`RESUMABLE_CHANGES` (and :data:`EXTENSION_FIELDS` when ``extending``: a
    new total is being set, which rewrites both)."""
    def hint(key: str) -> str:
        return ("to change the total: klppo train --resume DIR --total-steps N"
                if key in EXTENSION_FIELDS else
                "undo the edit or start a new run; docs/reliability.md says what may change")

    free = RESUMABLE_CHANGES | (EXTENSION_FIELDS if extending else frozenset())
    check_config_unchanged(run_dir, to_dict(cfg), saved, to_dict(TrainConfig()), free, hint)


def check_env_module(run_dir: Path, cfg: TrainConfig, state: Any) -> None:
    """An env of ``config.yaml`` (``cfg``) that names a module (``module:Id``, imported to
    build it) is built only when the checkpoint's own config names the same: ``klppo eval``
    and :func:`klppo.load` check it first, so an edit of ``config.yaml`` never chooses code to
    run (another run's checkpoint is named by the checks of its shapes)."""
    saved = state.get("config") if isinstance(state, dict) else None
    made_for = saved.get("env") if isinstance(saved, dict) else None
    if ":" in cfg.env and made_for is not None and made_for != cfg.env:
        raise ResumeError(f"{run_dir / 'checkpoint.pt'}: made for env={short_repr(made_for)}, "
                          f"but config.yaml names env={short_repr(cfg.env)}, a module to "
                          f"import: nothing is built from an edited config.yaml (undo the edit)")


def _check_metadata(run_dir: Path) -> None:
    import json

    path = run_dir / "metadata.json"
    if not path.exists():
        return
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ResumeError(f"{path}: unreadable ({type(e).__name__}); restore it, or delete it "
                          f"(the run's provenance is then lost)") from None
    if not isinstance(meta, dict):
        raise ResumeError(f"{path}: holds {type(meta).__name__} {short_repr(meta)}, not a mapping")
    resumes = meta.get("resumes", [])
    if not isinstance(resumes, list) or not all(isinstance(r, dict) for r in resumes):
        raise ResumeError(f"{path}: resumes={short_repr(resumes)}, not a list of resume "
                          f"records")
    if meta.get("kind", "train") != "train":
        raise ResumeError(f"{path}: kind={short_repr(meta['kind'])}: not a training run "
                          f"(klppo train --resume continues runs of klppo train)")


def check_resume(run_dir: Path, cfg: TrainConfig, state: dict[str, Any] | None,
                 extending: bool = False) -> list[dict[str, Any]]:
    """Check that a run directory's files belong together before a resume touches any of them;
    return the metrics kept (up to the checkpoint). One-line :class:`ResumeError` otherwise.
    ``extending``: the resume sets a new total, so :data:`EXTENSION_FIELDS` may differ."""
    _check_metadata(run_dir)
    if state is None:
        # the metrics line of an iteration is written before its checkpoint: a run stopped in
        # between (kill, full disk) holds up to checkpoint_every lines and no checkpoint, and
        # restarts from scratch; more lines mean a checkpoint was written and is gone
        done = [r["iteration"] for r in metrics_records(run_dir / "metrics.jsonl")]
        if done and max(done) > cfg.checkpoint_every:
            raise ResumeError(f"{run_dir / 'checkpoint.pt'}: missing, but metrics.jsonl holds "
                              f"iteration {max(done)} (a checkpoint is written every "
                              f"{cfg.checkpoint_every}); restore checkpoint.pt, or delete "
                              f"metrics.jsonl to restart the run from scratch")
        return []
    iteration, step = state["iteration"], state.get("global_step")
    if "config" in state:
        _check_config(run_dir, cfg, state["config"], extending)
    if step != iteration * cfg.batch_size or iteration > cfg.num_iterations:
        raise ResumeError(f"{run_dir / 'checkpoint.pt'}: iteration {iteration} at global step "
                          f"{short_repr(step)} does not fit this run's config (batch "
                          f"{cfg.batch_size}, {cfg.num_iterations} iterations): a checkpoint "
                          f"of another run?")
    kept = check_metrics(run_dir, iteration)
    for r in kept:
        if r.get("global_step") != r["iteration"] * cfg.batch_size:
            raise ResumeError(f"{run_dir / 'metrics.jsonl'}: iteration {r['iteration']} has "
                              f"global_step={short_repr(r.get('global_step'))}, not "
                              f"{r['iteration'] * cfg.batch_size} (batch {cfg.batch_size}); "
                              f"the file was edited or is another run's")
    return kept


LR_PLANS = ("replan", "continue")


def extend_config(cfg: TrainConfig, iteration: int, total_steps: int,
                  lr_plan: str = "replan") -> TrainConfig:
    """``cfg`` with the new ``total_steps`` for a run whose checkpoint is at ``iteration``.

    The iterations done keep their learning rates. With ``ppo.anneal_lr`` the rest of the run
    anneals by ``lr_plan`` (``lr_anneal_from``, :func:`klppo.rl.lr_schedule.lr_fraction`):
    ``replan`` (the default, as Stable-Baselines3's ``learn(..., reset_num_timesteps=False)``)
    gives the rates of a schedule planned over the new total from the start, ``1 - k / N`` of
    ``ppo.lr`` at the next iteration falling to ``1 / N`` at the new end; ``continue`` goes on
    from the rate of the last iteration done (it never jumps, but a finished run then learns at
    about ``ppo.lr / N``, hardly at all). A run with no iteration done simply gets the new total.
    :class:`ConfigError` naming ``total_steps`` (or ``lr_plan``) when it adds no iteration."""
    if lr_plan not in LR_PLANS:
        raise ConfigError(f"lr_plan={short_repr(lr_plan)}: must be one of {', '.join(LR_PLANS)}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int):
        raise ConfigError(f"total_steps={short_repr(total_steps)}: must be an integer")
    new = validate(dataclasses.replace(cfg, total_steps=total_steps))
    if new.num_iterations <= iteration:
        raise ConfigError(f"total_steps={total_steps:,}: the run has already done {iteration:,} "
                          f"iterations ({iteration * cfg.batch_size:,} steps); a new total must "
                          f"add at least one iteration of {cfg.batch_size:,} steps")
    if new.num_iterations == cfg.num_iterations or iteration == 0 or not cfg.ppo.anneal_lr:
        return new  # the same schedule, or none yet run
    rate = 1.0 - iteration / new.num_iterations if lr_plan == "replan" else \
        lr_fraction(cfg, iteration)
    anchor = (float(iteration), rate)
    return validate(dataclasses.replace(new, lr_anneal_from=anchor))


def write_extension(run_dir: Path, cfg: TrainConfig, state: dict[str, Any] | None) -> None:
    """A new total: ``config.yaml``, then the checkpoint's own copy of the config (each written
    atomically; the same command again mends a run stopped between the two)."""
    R.write_yaml(run_dir / "config.yaml", to_dict(cfg))
    if state is not None and "config" in state:
        ckpt.save_checkpoint(run_dir, {**state, "config": to_dict(cfg)})
