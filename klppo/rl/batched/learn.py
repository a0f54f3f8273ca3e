"""The update phase of many runs in lock step: their epochs and minibatches side by side.

Per run this is :meth:`klppo.rl.update.Learner.update` step for step: a fresh permutation from the
run's own generator at each epoch it enters, its :class:`~klppo.rl.update.Schedule` (controller
cadence, both early stops, beta read before each step), its own advantages, and its diagnostics
by its own learner. Minibatch ``j`` of every run still updating is computed in one
:func:`~klppo.rl.batched.step.stacked_step`; a run that stopped early takes no further steps (the
others step as a gathered subset). ``tests/rl/test_batched.py`` holds every run to the ordinary
engine's metrics and checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from klppo.core._checks import validation
from klppo.core.advantages import normalize_advantage
from klppo.nn.numpy import mlp
from klppo.nn.step import StepResult
from klppo.rl.batched.step import Minibatch
from klppo.rl.update import Batch, Schedule, UpdateResult

__all__ = ["RunUpdate", "Rollouts", "update_all", "policy_kls"]


@dataclass
class RunUpdate:
    """One run's update in progress: its stack row, learner, rollout and advantages, its
    schedule and steps so far."""

    row: int
    learner: Any
    batch: Batch
    adv: torch.Tensor
    sched: Schedule = field(init=False)
    steps: list[StepResult] = field(default_factory=list)
    epochs: int = 0
    done: bool = False
    in_epoch: bool = False
    perm: torch.Tensor | None = None
    before: int = 0

    def __post_init__(self) -> None:
        ln = self.learner
        self.sched = ln.schedule = Schedule(ln.cfg, ln.controller, ln.uses_beta)
        ln.backend.begin(self.batch, self.adv)

    @classmethod
    def start(cls, row: int, learner: Any, batch: Batch) -> RunUpdate:
        """The update of ``batch`` with ``learner``'s advantage normalisation."""
        adv = (normalize_advantage(batch.advantages) if learner.cfg.ppo.norm_adv == "rollout"
               else batch.advantages)
        return cls(row, learner, batch, adv)

    def start_epoch(self) -> None:
        self.perm = torch.randperm(len(self.batch), generator=self.learner.gen)
        self.before, self.in_epoch = len(self.steps), True
        self.sched.start_epoch()

    def end_epoch(self) -> None:
        """The epoch's end as :meth:`Learner.update` has it: stop after an early stop, an epoch
        without a step, or the epoch rule."""
        self.epochs += len(self.steps) > self.before  # as Learner.update counts them
        if self.sched.early_stopped or len(self.steps) == self.before:
            self.done = True
        elif self.sched.after_epoch(self.steps[-1], self.batch):
            self.done = True

    def result(self) -> UpdateResult:
        """The update's metrics (the learner's own diagnostics) and controller records."""
        metrics = self.learner._diagnostics(self.batch, self.steps)  # Learner.update's own
        p = self.learner.cfg.ppo
        planned = p.update_epochs * -(-len(self.batch) // p.minibatch_size)
        metrics.update(early_stop=float(self.sched.early_stopped), epochs=float(self.epochs),
                       minibatch_steps=float(len(self.steps)),
                       update_fraction=len(self.steps) / planned)
        return UpdateResult(metrics, self.sched.updates)


class Rollouts:
    """The runs' flattened rollouts stacked ``[R, B, ...]`` once per iteration (rows of runs not
    updating keep old numbers), so a minibatch of every run is one gather per field."""

    FIELDS = ("obs", "actions", "params", "logp", "returns", "values")

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def fill(self, R: int, updates: list[RunUpdate]) -> None:
        for name in (*self.FIELDS, "adv"):
            for u in updates:
                x = (u.adv if name == "adv" else getattr(u.batch, name)).numpy()
                a = self.arrays.get(name)
                if a is None or a.shape[1:] != x.shape or a.dtype != x.dtype:
                    a = self.arrays[name] = np.zeros((R, *x.shape), x.dtype)
                a[u.row] = x

    def minibatch(self, rows: np.ndarray, idx: np.ndarray) -> Minibatch:
        """Rows ``idx [A, n]`` of the runs ``rows`` (copies, gathered with one flat index)."""
        B = self.arrays["obs"].shape[1]
        flat = (rows[:, None] * B + idx).ravel()
        g = {name: a.reshape(-1, *a.shape[2:]).take(flat, 0).reshape(*idx.shape, *a.shape[2:])
             for name, a in self.arrays.items()}
        return Minibatch(idx, g["obs"], g["actions"], g["params"], g["logp"], g["adv"],
                         g["returns"], g["values"])


def update_all(stack: Any, updates: list[RunUpdate], rollouts: Rollouts, ws: mlp.Workspace,
               ops: Any) -> list[UpdateResult | BaseException]:
    """Every run's update (see the module docstring) with the stack's step module ``ops``; per
    run its result, or the error that stopped it (a non-finite loss)."""
    rollouts.fill(stack.R, updates)
    cfg = updates[0].learner.cfg.ppo  # the group shares epochs, batch and minibatch sizes
    B, size = len(updates[0].batch), cfg.minibatch_size
    with validation(False):  # inputs come from checked rollouts; results are checked below
        for _epoch in range(cfg.update_epochs):
            active = [u for u in updates if not u.done]
            if not active:
                break
            for u in active:
                u.start_epoch()
            for start in range(0, B, size):
                stepping = [u for u in active if u.in_epoch and not _skips(u, start, size)]
                if not stepping:
                    break
                _step(stack, stepping, start, size, rollouts, ws, ops)
            for u in active:
                u.end_epoch()
        out: list[UpdateResult | BaseException] = []
        for u in updates:
            try:
                out.append(u.result())
            except (FloatingPointError, ValueError) as e:  # this run's loss became non-finite
                out.append(e)
    return out


def _skips(u: RunUpdate, start: int, size: int) -> bool:
    """The minibatch early stop of run ``u`` (its k3 on its own network); it ends its epoch."""
    idx = u.perm[start:start + size]
    if u.sched.skip_minibatch(lambda: u.learner.backend.k3(idx)):
        u.in_epoch = False
        return True
    return False


def _step(stack: Any, stepping: list[RunUpdate], start: int, size: int,
          rollouts: Rollouts, ws: mlp.Workspace, ops: Any) -> None:
    rows = np.array([u.row for u in stepping])
    idx = np.stack([u.perm[start:start + size].numpy() for u in stepping])
    results = ops.stacked_step(stack, rows, rollouts.minibatch(rows, idx),
                               [u.learner.loss for u in stepping],
                               [u.sched.beta() for u in stepping], ws)
    for u, r in zip(stepping, results):
        u.steps.append(r)
        u.sched.after_step(r, size)


def policy_kls(stack: Any, updates: list[RunUpdate], rollouts: Rollouts,
               ws: mlp.Workspace, ops: Any) -> list[float]:
    """Each run's rollout KL after its update (:meth:`Learner.end_iteration`'s), from one
    stacked forward."""
    rows = np.array([u.row for u in updates])
    obs, params = rollouts.arrays["obs"], rollouts.arrays["params"]
    if len(rows) != stack.R:
        obs, params = obs[rows], params[rows]
    return ops.stacked_policy_kl(stack, rows, obs, params, ws)
