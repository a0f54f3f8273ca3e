"""``train(config) -> TrainResult``: the PPO loop in visible phases.

collect -> advantages -> update -> controller -> log -> checkpoint, once per iteration. The same
entry point serves the CLI, tests, notebooks and sweeps; ``resume(run_dir)`` continues a run from
its last checkpoint and reproduces the metrics of an uninterrupted run exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from klppo.rl.config import TrainConfig, to_dict
from klppo.rl.config_checks import validate
from klppo.rl.engine.group import Group
from klppo.rl.engine.groups import StackSet
from klppo.rl.envs import (
    check_env,
    env_state,
    make_vector_env,
    restore_env_state,
)
from klppo.rl.eval_during import Evaluator
from klppo.rl.lifecycle import (
    ResumeError,
    RunTrainer,
    check_resume,
    extend_config,
    read_run_config,
    write_extension,
)
from klppo.rl.marl.spec import check_multiagent, is_multiagent
from klppo.rl.marl.trainer import MultiTrainer
from klppo.rl.monitor import ExplosionMonitor
from klppo.rl.rollout import Collector
from klppo.rl.spaces import write_spaces
from klppo.rl.unit import PolicyUnit, episode_means
from klppo.runs import checkpoint as ckpt
from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.device import resolve_device
from klppo.runs.errors import RunFailed
from klppo.runs.install import install_hint
from klppo.runs.lifecycle import OnIteration, RunLife, run_iterations
from klppo.runs.protocol import final_return
from klppo.runs.threads import compute_threads

log = logging.getLogger(__name__)

#: builds a policy's row of its stack from its network and loss
MakeStep = Callable[[Any, Any], Any]
#: a run's makers: its policy's name and config -> the policy's MakeStep
Makers = Callable[[str, TrainConfig], MakeStep]

__all__ = ["TrainResult", "TrainingError", "ResumeError", "train", "resume", "plan_resume",
           "final_return", "TIMING_KEYS"]

#: metrics that measure wall time; everything else is deterministic for a given seed.
TIMING_KEYS = frozenset({"sps", "time_collect", "time_update", "time_elapsed"})


class TrainingError(RunFailed):
    """A run stopped on an error; its last good checkpoint is kept."""


@dataclass
class TrainResult:
    run_dir: Path
    metrics: list[dict[str, Any]]
    status: str
    #: the signal that stopped an 'interrupted' run (None otherwise)
    stop_signal: int | None = None

    @property
    def final_return(self) -> float:
        """KLip-PPO protocol: mean training-episode return over the last 10% of steps."""
        return final_return(self.metrics)

    @property
    def policies(self) -> list[str]:
        """The policies of a multi-agent run (empty for a single-agent one)."""
        first = self.metrics[0] if self.metrics else {}
        return [k[:-len("/kl_rollout")] for k in first if k.endswith("/kl_rollout")]

    def final_returns(self) -> dict[str, float]:
        """Per policy of a multi-agent run, its final return (as :attr:`final_return`)."""
        return {p: final_return(self.metrics, policy=p) for p in self.policies}


class _Trainer(RunTrainer):
    """A single-agent run: one vector env, one collector, one :class:`PolicyUnit` whose network
    is a row of a stack (``make_step``: its :class:`~klppo.rl.engine.StackSet` maker). Its
    iterations are its engine group's (:class:`~klppo.rl.engine.Group`), which collects it in lock
    step with the other single-agent runs of its stack."""

    lockstep = True

    def __init__(self, cfg: TrainConfig, run_dir: Path, make_step: MakeStep) -> None:
        self.cfg = validate(cfg)
        self.run_dir = run_dir
        torch.manual_seed(cfg.seed)
        self.env = make_vector_env(cfg.env, cfg.rollout.num_envs, cfg.seed,
                                   cfg.rollout.vectorization, cfg.env_kwargs,
                                   cfg.rollout.env_backend)
        obs_dim = int(np.prod(self.env.single_observation_space.shape))
        self.unit = u = PolicyUnit(cfg, obs_dim, self.env.single_action_space,
                                   cfg.rollout.num_envs, cfg.seed + 2, make_step=make_step)
        self.agent, self.learner, self.controller = u.agent, u.learner, u.controller
        self.collector = Collector(self.env, u.agent, cfg.rollout.num_steps, cfg.seed + 1,
                                   u.obs_norm, u.rew_scale, u.weights)
        self.monitor = ExplosionMonitor()
        self.evaluator = (Evaluator(cfg, run_dir, self.env.single_observation_space,
                                    self.env.single_action_space) if cfg.eval_every else None)
        self.iteration = 0
        self.global_step = 0
        #: the torch RNG state this run's own process would hold (runs share a process): what
        #: its checkpoint saves
        self.own_torch_rng = torch.get_rng_state()

    @classmethod
    def alone(cls, cfg: TrainConfig, run_dir: Path) -> _Trainer:
        """The trainer of a run alone (a group of one), outside any run-directory lifecycle."""
        stacks = StackSet.of([cfg])
        tr = cls(cfg, run_dir, stacks.maker(0, "", cfg))
        Group([tr])
        return tr

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "global_step": self.global_step,
            **self.unit.state_dict(),
            "collector": self.collector.state_dict(),
            "torch_rng": self.own_torch_rng,
            "env": env_state(self.env),
            **(self.evaluator.state_dict() if self.evaluator is not None else {}),
        }

    def load_state_dict(self, s: dict[str, Any]) -> list[str]:
        """Restore everything; return the problems of the environment restore (empty: exact)."""
        self.iteration, self.global_step = int(s["iteration"]), int(s["global_step"])
        self.unit.load_state_dict(s)
        self.collector.load_state_dict(s["collector"])
        torch.set_rng_state(s["torch_rng"])
        self.own_torch_rng = torch.get_rng_state()
        if self.evaluator is not None:
            self.evaluator.load_state_dict(s)
        problems = list(restore_env_state(self.env, s.get("env"), self.cfg.env))
        if problems:  # the env could not be restored: start new episodes, deterministically
            self.collector.reset(self.cfg.seed + self.iteration)
        return problems

    def start(self) -> None:
        """First episodes of a new run."""
        self.collector.reset(self.cfg.seed)

    def describe(self, m: dict[str, Any]) -> str:
        """A short summary of one iteration's metrics (for the log)."""
        text = (f"step {self.global_step} return {m['episode_return_mean']} "
                f"kl {m['kl_rollout']:.4g}")
        if "eval_return_mean" in m:
            text += f" eval {m['eval_return_mean']:.4g}"
        return text

    # ---------------------------------------------------------------- what the group asks
    def start_iteration(self, it: int) -> float:
        """Set iteration ``it``'s learning rate; return it."""
        return self.unit.start_iteration(it)

    def collect_rollout(self, iteration: int) -> Any:
        """One rollout of this run alone through its group's lock-step collection (what an
        iteration collects; for tests and notebooks): its episodes."""
        out = self.group.collect({self.group_index: self}, {self.group_index: iteration})
        res = out[self.group_index]
        if isinstance(res, BaseException):
            raise res
        return res

    @property
    def policy_units(self) -> list[PolicyUnit]:
        """The run's policies (one)."""
        return [self.unit]

    def rollouts(self, episodes: Any) -> list[tuple[str, PolicyUnit, Any]]:
        """The policy and the buffer it learns from after a rollout."""
        return [("", self.unit, self.collector.buf)]

    def iteration_metrics(self, it: int, episodes: Any, reports: dict[str, dict[str, Any]],
                          lr: float) -> dict[str, Any]:
        """One iteration's metrics from its episodes and the policy's report."""
        m = {"iteration": it, "global_step": self.global_step,
             **episode_means(episodes.returns, episodes.lengths), "lr": lr, **reports[""]}
        if self.evaluator is not None and self.evaluator.due(it, self.num_iterations):
            m.update(self.evaluator.evaluate(it, self.unit.state_dict()))
        return m


@functools.cache
def _no_tensorboard() -> None:
    """Warn once per process (not once per run of a group or sweep) that no events are
    written."""
    log.warning("tensorboard is not installed: no TensorBoard events (%s; --no-tensorboard "
                "silences this)", install_hint("tensorboard"))


def _sinks(cfg: TrainConfig, run_dir: Path) -> list[M.Sink]:
    """metrics.jsonl, and the dashboards with the config as hyperparameters."""
    sinks: list[M.Sink] = [M.JsonlSink(run_dir / "metrics.jsonl")]
    if cfg.tensorboard:
        try:
            sinks.append(M.TensorBoardSink(run_dir, to_dict(cfg), cfg.metric_names))
        except ImportError:
            _no_tensorboard()
    if cfg.track == "wandb":
        w = cfg.wandb
        sinks.append(M.WandbSink(run_dir, run_dir.name, to_dict(cfg),
                                 M.WandbSettings(w.project, w.entity, w.group, tuple(w.tags)),
                                 cfg.metric_names))
    return sinks


def _run(tr: _Trainer | MultiTrainer, life: RunLife, on_iteration: OnIteration) -> TrainResult:
    """Iterate to the end (or a stop request) under the shared run lifecycle; a failure leaves
    status 'failed' with the reason and raises :class:`TrainingError` (one line)."""
    state = run_iterations(tr, life, lambda: M.MetricsWriter(_sinks(tr.cfg, life.run_dir)),
                           on_iteration, TrainingError)
    records, _ = M.read_metrics(life.run_dir / "metrics.jsonl")
    return TrainResult(life.run_dir, records, state, life.stop_signal)


def _start(run_dir: Path, cfg: TrainConfig, lock: R.DirLock,
           makers: Makers | None = None) -> _Trainer | MultiTrainer:
    """Build the trainer in a locked run directory and record its spaces (``spaces.json``, so
    :func:`klppo.load` needs no env); a failure leaves status 'failed'. Without ``makers`` (the
    rows of a group's stacks) the run is a group of one."""
    try:
        alone = makers is None
        if makers is None:
            stacks = StackSet.of([cfg])
            makers = lambda name, c: stacks.maker(0, name, c)  # noqa: E731
        tr = (MultiTrainer(cfg, run_dir, makers) if is_multiagent(cfg.env)
              else _Trainer(cfg, run_dir, makers("", cfg)))
        if alone:
            Group([tr])
        try:
            _save_spaces(tr, run_dir)
        except BaseException:
            tr.close()
            raise
        return tr
    except Exception as e:
        lock.release()
        msg = f"cannot start: {type(e).__name__}: {e}"
        R.write_status(run_dir, "failed", error=msg, traceback=traceback.format_exc(),
                       iteration=0)
        raise TrainingError(msg) from e


def _save_spaces(tr: _Trainer | MultiTrainer, run_dir: Path) -> None:
    if isinstance(tr, MultiTrainer):
        s = tr.spec
        write_spaces(run_dir, policies={p: (agents, s.obs_spaces[p], s.action_spaces[p])
                                        for p, agents in s.policies.items()})
    else:
        write_spaces(run_dir, tr.env.single_observation_space, tr.env.single_action_space)


def train(config: TrainConfig, on_iteration: OnIteration = None) -> TrainResult:
    """Train from scratch into a new run directory (``config.out`` or a default name).

    Every check (config, env, extras, the output path) runs before the directory is created.
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
        return _run(tr, life, on_iteration)


def open_new(config: TrainConfig, threads: dict[str, Any], makers: Makers | None = None,
             meta: dict[str, Any] | None = None) -> tuple[_Trainer | MultiTrainer, RunLife]:
    """A new run's locked directory with its config and metadata (``meta`` added to it), and
    its trainer at its first episodes (``config`` checked by the caller)."""
    run_dir, lock = _new_run_dir(config)
    if (run_dir / "metrics.jsonl").exists():  # another process finished a run there meanwhile
        lock.release()
        raise FileExistsError(f"out={str(run_dir)!r} already holds a run; use --resume")
    _write_start_files(run_dir, config, threads, lock, meta)
    tr = _start(run_dir, config, lock, makers)
    tr.start()
    return tr, RunLife(run_dir, lock)


def _new_run_dir(cfg: TrainConfig) -> tuple[Path, R.DirLock]:
    """Create and lock the run directory; on a full disk, remove what was made (an empty
    directory) and raise the error naming the path."""
    if cfg.out:
        run_dir = R.create_run_dir(cfg.out)
    else:
        name = R.default_run_name(cfg.env, cfg.objective, cfg.seed)
        run_dir = R.create_run_dir(Path(cfg.runs_root) / name, unique=True)
    try:
        return run_dir, R.DirLock(run_dir).acquire()
    except OSError:
        (run_dir / ".lock").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            run_dir.rmdir()  # only if it is empty: nothing of anyone else's is removed
        raise


def _write_start_files(run_dir: Path, cfg: TrainConfig, threads: dict[str, Any],
                       lock: R.DirLock, meta: dict[str, Any] | None = None) -> None:
    """config.yaml and metadata.json of a new run; if they cannot be written (a full disk), the
    new directory is removed again and the error names the file."""
    try:
        R.write_yaml(run_dir / "config.yaml", to_dict(cfg))
        R.write_metadata(run_dir, {"kind": "train", "threads": threads, **(meta or {})})
    except OSError:
        lock.release()
        for name in ("config.yaml", "metadata.json", ".lock"):
            (run_dir / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            run_dir.rmdir()  # only if it is empty: nothing of anyone else's is removed
        raise


def resume(run_dir: str | Path, on_iteration: OnIteration = None,
           total_steps: int | None = None, lr_plan: str = "replan") -> TrainResult:
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
    """
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    resolve_device(cfg.device)
    with compute_threads(cfg.torch_threads) as threads:
        tr, life, kept = open_existing(run_dir, cfg, threads, total_steps=total_steps,
                                       lr_plan=lr_plan)
        if tr.iteration >= tr.num_iterations:
            tr.close()
            life.status("finished", tr.iteration)
            life.lock.release()
            return TrainResult(run_dir, kept, "finished")
        return _run(tr, life, on_iteration)


def open_existing(run_dir: Path, cfg: TrainConfig, threads: dict[str, Any],
                  makers: Makers | None = None, meta: dict[str, Any] | None = None,
                  total_steps: int | None = None, lr_plan: str = "replan"
                  ) -> tuple[_Trainer | MultiTrainer, RunLife, list[dict[str, Any]]]:
    """Lock a run directory (``cfg`` is its config), check its files, and rebuild its trainer
    from the last checkpoint (or start it); return the trainer, the run's life and the metrics
    kept. The metadata records this start (``meta`` added to it); ``total_steps`` sets a new
    total first (see :func:`resume`); a refusal leaves status 'failed' and raises one line."""
    lock = R.DirLock(run_dir).acquire()
    try:
        R.remove_stale_temp_files(run_dir)
        state = ckpt.load_checkpoint(run_dir) if (run_dir / ckpt.CHECKPOINT).exists() else None
        kept = check_resume(run_dir, cfg, state, extending=total_steps is not None)
    except (ckpt.CheckpointError, ResumeError) as e:
        _refuse(run_dir, lock, e)
    if total_steps is not None:
        old = cfg.total_steps
        try:  # bad input: nothing is written, the run keeps its status
            cfg = extend_config(cfg, int(state["iteration"]) if state else 0, total_steps,
                                lr_plan)
        except BaseException:
            lock.release()
            raise
        write_extension(run_dir, cfg, state)
        if old != cfg.total_steps:
            meta = {**(meta or {}), "extended": {"total_steps": [old, cfg.total_steps]}}
    tr = _start(run_dir, cfg, lock, makers)
    problems = _restore(tr, state, lock)
    _record_start(run_dir, state, threads, meta)
    M.rewrite_metrics(run_dir / "metrics.jsonl", kept)
    life = RunLife(run_dir, lock, saved=tr.iteration)
    for p in problems:
        life.warn(f"resume is not exact: {p}")
    tr.monitor.seed(kept)
    return tr, life, kept


def _refuse(run_dir: Path, lock: R.DirLock, error: Exception) -> NoReturn:
    """End a resume that cannot go on: status 'failed' with the reason, the lock released."""
    try:
        R.write_status(run_dir, "failed", error=str(error), iteration=0)
    finally:
        lock.release()
    raise error


def _restore(tr: _Trainer | MultiTrainer, state: dict[str, Any] | None,
             lock: R.DirLock) -> list[str]:
    """Load ``state`` into the new trainer (or start it); a checkpoint whose contents do not fit
    the run (shapes, keys) is refused in one line naming it."""
    if state is None:
        tr.start()
        return []
    try:
        return tr.load_state_dict(state)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
        tr.env.close()
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        _refuse(tr.run_dir, lock, ResumeError(
            f"{tr.run_dir / ckpt.CHECKPOINT}: does not fit this run's config "
            f"({type(e).__name__}: {detail}); a checkpoint of another run?"))


def _record_start(run_dir: Path, state: dict[str, Any] | None, threads: dict[str, Any],
                  meta: dict[str, Any] | None = None) -> None:
    meta = meta or {}
    if not (run_dir / "metadata.json").exists():
        R.write_metadata(run_dir, {"kind": "train", "threads": threads, **meta})
    elif state is not None or "extended" in meta:
        R.record_resume(run_dir, int(state["iteration"]) if state else 0, threads=threads,
                        **meta)


def plan_resume(run_dir: str | Path, total_steps: int | None = None) -> TrainConfig:
    """The config a resume of ``run_dir`` (with a new ``total_steps``) runs for: its length and
    objective, for a progress display; the resume itself checks everything."""
    cfg = read_run_config(run_dir)
    if total_steps is None or total_steps == cfg.total_steps:
        return cfg
    return validate(dataclasses.replace(cfg, total_steps=total_steps))
