"""A run directory opened for training: a new one (created, locked, its config and metadata
written) or an existing one (locked, checked, its checkpoint restored), its trainer built and
started, its sinks; the results a finished run returns. :mod:`klppo.rl.trainer` and the
engine's groups (:mod:`klppo.rl.engine.rundirs`) both open runs through here."""

from __future__ import annotations

import contextlib
import functools
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from klppo.rl.config import TrainConfig, to_dict
from klppo.rl.engine.group import Group
from klppo.rl.engine.groups import StackSet
from klppo.rl.lifecycle import ResumeError, check_resume, extend_config, write_extension
from klppo.rl.marl.spec import is_multiagent
from klppo.rl.marl.trainer import MultiTrainer
from klppo.rl.single import Makers, SingleTrainer
from klppo.rl.spaces import write_spaces
from klppo.runs import checkpoint as ckpt
from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.errors import RunFailed
from klppo.runs.install import install_hint
from klppo.runs.lifecycle import OnIteration, RunLife
from klppo.runs.loop import run_iterations
from klppo.runs.protocol import final_return

log = logging.getLogger("klppo.rl.trainer")

__all__ = ["TrainResult", "TrainingError", "sinks", "run_to_end", "open_new", "open_existing"]


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


@functools.cache
def _no_tensorboard() -> None:
    """Warn once per process (not once per run of a group or sweep) that no events are
    written."""
    log.warning("tensorboard is not installed: no TensorBoard events (%s; --no-tensorboard "
                "silences this)", install_hint("tensorboard"))


def sinks(cfg: TrainConfig, run_dir: Path) -> list[M.Sink]:
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


def run_to_end(tr: SingleTrainer | MultiTrainer, life: RunLife,
               on_iteration: OnIteration) -> TrainResult:
    """Iterate to the end (or a stop request) under the shared run lifecycle; a failure leaves
    status 'failed' with the reason and raises :class:`TrainingError` (one line)."""
    state = run_iterations(tr, life, lambda: M.MetricsWriter(sinks(tr.cfg, life.run_dir)),
                           on_iteration, TrainingError)
    records, _ = M.read_metrics(life.run_dir / "metrics.jsonl")
    return TrainResult(life.run_dir, records, state, life.stop_signal)


def _start(run_dir: Path, cfg: TrainConfig, lock: R.DirLock,
           makers: Makers | None = None) -> SingleTrainer | MultiTrainer:
    """Build the trainer in a locked run directory and record its spaces (``spaces.json``, so
    :func:`klppo.load` needs no env); a failure leaves status 'failed'. Without ``makers`` (the
    rows of a group's stacks) the run is a group of one."""
    try:
        alone = makers is None
        if makers is None:
            stacks = StackSet.of([cfg])
            makers = lambda name, c: stacks.maker(0, name, c)  # noqa: E731
        tr = (MultiTrainer(cfg, run_dir, makers) if is_multiagent(cfg.env)
              else SingleTrainer(cfg, run_dir, makers("", cfg)))
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


def _save_spaces(tr: SingleTrainer | MultiTrainer, run_dir: Path) -> None:
    if isinstance(tr, MultiTrainer):
        s = tr.spec
        write_spaces(run_dir, policies={p: (agents, s.obs_spaces[p], s.action_spaces[p])
                                        for p, agents in s.policies.items()})
    else:
        write_spaces(run_dir, tr.env.single_observation_space, tr.env.single_action_space)


def open_new(config: TrainConfig, threads: dict[str, Any], makers: Makers | None = None,
             meta: dict[str, Any] | None = None) -> tuple[SingleTrainer | MultiTrainer, RunLife]:
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


def open_existing(run_dir: Path, cfg: TrainConfig, threads: dict[str, Any],
                  makers: Makers | None = None, meta: dict[str, Any] | None = None,
                  total_steps: int | None = None, lr_plan: str = "replan"
                  ) -> tuple[SingleTrainer | MultiTrainer, RunLife, list[dict[str, Any]]]:
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
        if old != cfg.total_steps:
            meta = {**(meta or {}), "extended": {"total_steps": [old, cfg.total_steps]}}
    tr = _start(run_dir, cfg, lock, makers)
    problems = _restore(tr, state, lock)
    if total_steps is not None:  # the new total is written once the checkpoint has loaded
        try:
            write_extension(run_dir, cfg, state)
        except BaseException:
            tr.close()
            lock.release()
            raise
    _record_start(run_dir, state, threads, meta)
    M.rewrite_metrics(run_dir / "metrics.jsonl", kept)
    life = RunLife(run_dir, lock, saved=tr.iteration)
    for p in problems:
        life.warn(f"resume is not exact: {p}")
    tr.monitor.seed(kept)
    return tr, life, kept


def _refuse(run_dir: Path, lock: R.DirLock, error: Exception) -> NoReturn:
    """End a resume that cannot go on: status 'failed' with the reason (and the iterations
    the run's last status recorded: the checkpoint is untouched), the lock released."""
    try:
        R.write_refused(run_dir, str(error))
    finally:
        lock.release()
    raise error


def _restore(tr: SingleTrainer | MultiTrainer, state: dict[str, Any] | None,
             lock: R.DirLock) -> list[str]:
    """Load ``state`` into the new trainer (or start it); a checkpoint whose contents do not fit
    the run (shapes, keys) is refused in one line naming it."""
    if state is None:
        tr.start()
        return []
    try:
        return tr.load_state_dict(state)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError,
            OverflowError) as e:  # (a forged integer too large for numpy's or torch's types)
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
