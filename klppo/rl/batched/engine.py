"""``train_group(run_dirs)`` / ``train_batched(configs)``: many runs of one shape in one process.

Each run is an ordinary single-agent trainer (:class:`klppo.rl.trainer`'s: its env, collector,
:class:`~klppo.rl.unit.PolicyUnit`, checkpoint and run directory) whose step backend is its row
of a :class:`~klppo.rl.batched.stack.RunStack`. One iteration of every run is computed together
in the visible phases of the ordinary loop: learning rates, collection
(:func:`~klppo.rl.batched.collect.collect_all`), advantages, the update
(:func:`~klppo.rl.batched.learn.update_all`), the rollout KL and controller, the metrics. Each
run's directory is then written by the shared lifecycle (:func:`klppo.runs.group.run_group`):
config.yaml, metrics.jsonl, checkpoint.pt, status.json, metadata.json as the ordinary engine
writes them, so ``klppo report``, ``replay``, ``eval``, ``klppo.load`` and ``klppo train --resume``
read them unchanged.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from klppo.nn.numpy import mlp
from klppo.rl.batched import step as numpy_step
from klppo.rl.batched import torch_step
from klppo.rl.batched.collect import collect_all
from klppo.rl.batched.learn import Rollouts, RunUpdate, policy_kls, update_all
from klppo.rl.batched.serve import check_group, uses_numpy
from klppo.rl.batched.stack import RunStack
from klppo.rl.batched.torch_stack import TorchRunStack
from klppo.rl.config import TrainConfig, validate
from klppo.rl.envs import check_env
from klppo.rl.lifecycle import read_run_config
from klppo.rl.trainer import TrainResult, _sinks, open_existing, open_new
from klppo.rl.unit import episode_means, learning_rate
from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.device import resolve_device
from klppo.runs.errors import RunFailed, UserInputError
from klppo.runs.group import run_group
from klppo.runs.lifecycle import OnIteration, RunLife
from klppo.runs.threads import compute_threads

log = logging.getLogger(__name__)

__all__ = ["train_group", "train_batched", "BatchedGroup"]


class BatchedGroup:
    """The runs of one stack and one iteration of each of them at a time (see the module
    docstring); ``trainers[i]`` is stack row ``rows[i]``."""

    def __init__(self, stack: RunStack | TorchRunStack, ops: Any, trainers: list[Any],
                 rows: list[int]) -> None:
        self.stack, self.ops, self.trainers, self.rows = stack, ops, trainers, rows
        self.ws = mlp.Workspace()
        self.rollouts = Rollouts()
        self.obs: dict[str, Any] = {}
        self.clock: tuple[float, list[int]] | None = None

    def iterate(self, members: list[int]) -> list[dict[str, Any] | BaseException]:
        """One iteration of each member (indices into ``trainers``); per member its metrics
        (the ordinary trainer's, in its order) or the error that stopped it."""
        if self.clock is None:
            self.clock = (time.perf_counter(), [tr.global_step for tr in self.trainers])
        trs = {self.rows[i]: self.trainers[i] for i in members}
        its = {r: tr.iteration + 1 for r, tr in trs.items()}
        lrs = {r: learning_rate(tr.cfg, its[r]) for r, tr in trs.items()}
        for r, tr in trs.items():
            tr.learner.set_lr(lrs[r])
        t0 = time.perf_counter()
        out: dict[int, Any] = collect_all(self.stack, {r: tr.collector for r, tr in trs.items()},
                                          its, self.obs, self.ops)              # 1. collect
        episodes = {r: e for r, e in out.items() if not isinstance(e, BaseException)}
        for r in episodes:
            trs[r].global_step += trs[r].cfg.batch_size
        t1 = time.perf_counter()
        policies = self._learn({r: trs[r] for r in episodes}, its)               # 2-4. learn
        out.update(policies)
        t2 = time.perf_counter()
        n = max(1, len(trs))
        for r, pol in policies.items():
            if isinstance(pol, BaseException):
                continue
            tr, ep = trs[r], episodes[r]
            tr.iteration = its[r]
            m = {"iteration": its[r], "global_step": tr.global_step,           # 5. log
                 **episode_means(ep.returns, ep.lengths), "lr": lrs[r], **pol}
            m.update(time_collect=(t1 - t0) / n, time_update=(t2 - t1) / n)
            out[r] = self._timed(m, self.rows.index(r))
        return [out[self.rows[i]] for i in members]

    def _timed(self, m: dict[str, Any], i: int) -> dict[str, Any]:
        """``time_elapsed`` since this process started iterating and the run's ``sps`` over it
        (its own steps: the group's rate is the sum over its runs)."""
        start, steps = self.clock
        elapsed = time.perf_counter() - start
        m["time_elapsed"] = elapsed
        m["sps"] = (self.trainers[i].global_step - steps[i]) / max(elapsed, 1e-9)
        return m

    def _learn(self, trs: dict[int, Any], its: dict[int, int]) -> dict[int, Any]:
        """Advantages, the update, the rollout KL and controller, and each run's policy
        metrics (:meth:`PolicyUnit.report`)."""
        out: dict[int, Any] = {}
        updates = []
        for r, tr in trs.items():
            try:
                updates.append(RunUpdate.start(r, tr.learner, tr.unit.advantages(tr.collector.buf)))
            except Exception as e:  # noqa: BLE001 - this run's rollout: it alone stops
                out[r] = e
        if not updates:
            return out
        results = update_all(self.stack, updates, self.rollouts, self.ws, self.ops)
        kls = policy_kls(self.stack, updates, self.rollouts, self.ws, self.ops)
        for u, res, kl in zip(updates, results, kls):
            if isinstance(res, BaseException):
                out[u.row] = res
                continue
            try:
                u.sched.after_iteration(kl, len(u.batch))                 # Learner.end_iteration
                out[u.row] = trs[u.row].unit.report(u.batch, res, kl, u.sched.updates,
                                                    its[u.row])
            except Exception as e:  # noqa: BLE001 - this run's controller or metrics
                out[u.row] = e
        return out


def _meta(runs: int) -> dict[str, Any]:
    return {"engine": {"name": "batched", "runs": runs}}


def _stack(cfg: TrainConfig, runs: int) -> tuple[RunStack | TorchRunStack, Any]:
    """A group's stack and its step module: numpy where the fast path serves the runs (as
    :func:`klppo.rl.backends.make_backend` chooses, and saying what it says), else torch on
    ``cfg.device``."""
    dev = resolve_device(cfg.device)
    if uses_numpy(cfg):
        if dev.type != "cpu":
            log.warning("device %s: the numpy fast path runs on the CPU; add --no-fast-path "
                        "to train on %s with torch", dev, dev)
        return RunStack(runs), numpy_step
    if cfg.fast_path:
        log.warning("numpy fast path off: objective %r or its band has no closed form; the "
                    "batched engine stacks these runs with torch", cfg.objective)
    return TorchRunStack(runs, cfg.device), torch_step


def _run(stack: RunStack | TorchRunStack, ops: Any, opened: list[tuple[int, Any, RunLife]],
         on_iteration: OnIteration) -> dict[int, tuple[str, str | None]]:
    """Iterate the opened runs ``(row, trainer, life)`` together; each row's end state and
    error."""
    if not opened:
        return {}
    rows = [r for r, _, _ in opened]
    trainers = [tr for _, tr, _ in opened]
    group = BatchedGroup(stack, ops, trainers, rows)
    states, errors = run_group(trainers, [life for _, _, life in opened], group.iterate,
                               lambda i: M.MetricsWriter(_sinks(trainers[i].cfg,
                                                                opened[i][2].run_dir)),
                               on_iteration)
    return {r: (s, e) for r, s, e in zip(rows, states, errors)}


def _results(dirs: list[Path], ends: dict[int, tuple[str, str | None]]) -> list[TrainResult]:
    out = []
    for r, d in enumerate(dirs):
        records = M.read_metrics(d / "metrics.jsonl")[0] if (d / "metrics.jsonl").exists() else []
        out.append(TrainResult(d, records, ends.get(r, ("failed", None))[0]))
    return out


def train_group(run_dirs: list[str | Path], on_iteration: OnIteration = None
                ) -> list[TrainResult]:
    """Train (or resume, or skip when finished) the runs whose directories hold their
    ``config.yaml`` together in this process; one :class:`TrainResult` per directory, in order
    (status 'failed' for a run that failed or could not start: its status.json says why). The
    runs must be of one shape (:func:`~klppo.rl.batched.serve.check_group`: a one-line
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
    check_group(list(configs.values()), [str(dirs[r]) for r in configs])
    stack, ops = _stack(next(iter(configs.values())), len(dirs))
    opened: list[tuple[int, Any, RunLife]] = []
    busy: list[R.DirBusyError] = []
    with compute_threads(next(iter(configs.values())).torch_threads) as threads:
        try:
            for r, cfg in configs.items():
                try:
                    tr, life, _ = open_existing(dirs[r], cfg, threads, stack.maker(r, cfg.ppo),
                                                _meta(len(dirs)))
                except R.DirBusyError as e:  # another process's run: not ours to touch
                    busy.append(e)
                    continue
                except (RunFailed, UserInputError) as e:  # its status.json says why
                    log.warning("%s", e)
                    continue
                tr.own_torch_rng = torch.get_rng_state()
                opened.append((r, tr, life))
        except BaseException:
            _abandon(opened)
            raise
        results = _results(dirs, _run(stack, ops, opened, on_iteration))
    if busy:
        raise busy[0]
    return results


def _abandon(opened: list[tuple[int, Any, RunLife]]) -> None:
    """Close and unlock the runs opened before the start of the group failed."""
    for _, tr, life in opened:
        try:
            tr.close()
        finally:
            life.lock.release()


def train_batched(configs: list[TrainConfig], on_iteration: OnIteration = None
                  ) -> list[TrainResult]:
    """Train new runs (each into ``config.out`` or a default directory, as :func:`klppo.rl.train`
    names it) together in this process; every check runs before any directory is made."""
    for c in configs:
        validate(c)
        check_env(c.env, c.env_kwargs, c.objective, c.rollout.env_backend)
    check_group(configs, [f"run {i} ({c.env}, {c.objective}, seed {c.seed})"
                          for i, c in enumerate(configs)])
    stack, ops = _stack(configs[0], len(configs))
    opened: list[tuple[int, Any, RunLife]] = []
    with compute_threads(configs[0].torch_threads) as threads:
        try:
            for r, cfg in enumerate(configs):
                tr, life = open_new(cfg, threads, stack.maker(r, cfg.ppo), _meta(len(configs)))
                tr.own_torch_rng = torch.get_rng_state()
                opened.append((r, tr, life))
        except BaseException:
            _abandon(opened)
            raise
        return _results([life.run_dir for _, _, life in opened],
                        _run(stack, ops, opened, on_iteration))
