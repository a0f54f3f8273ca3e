"""THE PPO update loop: the epochs and minibatches of every policy of a stack, side by side.

Per policy this reads top to bottom as a one-run PPO update: for each epoch a fresh permutation
from the policy's own generator; for each minibatch its early-stop check (SB3's rule, k3 on its
own network), the before-step updates of its lr / clip actuator and clip-bound controller (BAPO),
its beta, one step, and its :class:`~klppo.rl.update.Schedule` (controller cadence, the
actuator's after-step update, the epoch rule). Minibatch ``j`` of every policy still updating is
computed in one stacked step (:meth:`klppo.rl.engine.numpy_stack.NumpyStack.step` or the torch
stack's); a policy that stopped early takes no further steps (the others step as a gathered
subset). A plain run is a stack of one: the same loop, ``R = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from klppo.core._checks import validation
from klppo.nn.numpy import mlp
from klppo.nn.step import StepResult
from klppo.rl.engine.rows import Minibatch, Stack
from klppo.rl.engine.steplog import StepLog
from klppo.rl.rollout import RolloutBuffer
from klppo.rl.update import (
    NON_FINITE,
    STEP_OUTPUTS,
    Batch,
    Learner,
    Schedule,
    UpdateResult,
    diagnostic_stats,
    step_parts,
)

__all__ = ["RunUpdate", "Rollouts", "update_rows", "policy_kls", "diagnostics_rows"]


@dataclass
class RunUpdate:
    """One policy's update in progress: its learner, rollout and advantages, its schedule and
    steps so far. ``row`` is its stack row (a policy keeps its row for the whole update)."""

    learner: Learner
    batch: Batch
    adv: torch.Tensor = field(init=False)
    sched: Schedule = field(init=False)
    steps: list[StepResult] = field(default_factory=list)
    epochs: int = 0
    done: bool = False
    in_epoch: bool = False
    perm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    before: int = 0
    row: int = field(init=False)

    def __post_init__(self) -> None:
        ln = self.learner
        self.row = int(ln.backend.row)
        self.adv = ln.advantages_for_update(self.batch)
        self.sched = ln.new_schedule()
        ln.backend.begin(self.batch, self.adv)
        if ln.band is not None:
            ln.band.begin(self.adv)

    @property
    def stack(self) -> Stack:
        return self.learner.backend.stack

    @property
    def plain(self) -> bool:
        """Whether :meth:`skips` never stops or acts (no minibatch early stop, no before-step
        update): the policy steps on every minibatch of its epochs."""
        return (self.learner.cfg.ppo.early_stop != "minibatch"
                and not self.sched.acts_before_step)

    def start_epoch(self) -> None:
        self.perm = torch.randperm(len(self.batch), generator=self.learner.gen).numpy()
        self.before, self.in_epoch = len(self.steps), True
        self.sched.start_epoch()

    @property
    def probes(self) -> bool:
        """Whether :meth:`skips` reads the minibatch's k3 (SB3's minibatch early stop)."""
        return self.learner.cfg.ppo.early_stop == "minibatch"

    def skips(self, start: int, size: int, k3: float | None = None) -> bool:
        """The minibatch early stop (it ends the policy's update), from ``k3``, the minibatch's
        k3 KL before the step (:meth:`~klppo.rl.engine.numpy_stack.NumpyStack.probe_k3`, all
        probing rows at once); else the before-step updates of its actuator and band controller
        for the minibatch at ``start`` (its sample indices ``idx``, a view of the epoch's
        permutation)."""
        self.idx = self.perm[start:start + size]
        sched = self.sched
        if sched.skip_minibatch(lambda: _probed(k3)):
            self.in_epoch = False
            return True
        if sched.acts_before_step:
            sched.before_step(torch.from_numpy(self.idx))
        return False

    def end_epoch(self) -> None:
        """Stop after an early stop, an epoch without a step, or the epoch rule."""
        self.epochs += len(self.steps) > self.before  # an epoch cut short by the stop counts
        if self.sched.early_stopped or len(self.steps) == self.before:
            self.done = True
        elif self.sched.after_epoch(self.steps[-1], self.batch):
            self.done = True

    def result(self, diagnostics: dict[str, float] | None = None) -> UpdateResult:
        return self.learner.update_metrics(self.batch, self.steps, self.sched, self.epochs,
                                           diagnostics)


class Rollouts:
    """The rollouts of a stack's updating rows as ``[R, B, ...]`` arrays once per iteration
    (the rows not updating hold numbers nothing reads): per field, the stack's stacked rollout
    itself when every updating row's is its row of it (the lock-step collection's buffer, its
    GAE written in it: nothing to copy), else the rows' copied (every row's, when one run
    changed the field for its update); at the start of each epoch, the rows' samples in the
    order of their epoch's permutations, one gather per field (:meth:`permute`), so that a
    minibatch of every row is a slice of them."""

    FIELDS = ("obs", "actions", "params", "logp", "returns", "values", "adv")
    #: a field of the update -> the stacked rollout's array of it
    STACKED = {**{name: name for name in FIELDS}, "adv": "advantages"}

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._owned: set[str] = set()  # the fields whose arrays are copies (not the rollout's)
        self._rows: dict[tuple[int, ...], np.ndarray] = {}
        #: this epoch's rows (stack rows), their permutations ``[A, B]`` and their samples in
        #: permutation order, read-only
        self.epoch_rows: tuple[int, ...] = ()
        self.perms = np.zeros((0, 0), np.int64)
        self.epoch: dict[str, np.ndarray] = {}

    def rows_of(self, stepping: list[RunUpdate]) -> np.ndarray:
        """The stack rows of ``stepping`` as a read-only array, kept with the stack's rollouts
        (the same sets of rows step again and again)."""
        key = tuple(u.row for u in stepping)
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = np.array(key)
            rows.flags.writeable = False
        return rows

    def fill(self, R: int, updates: list[RunUpdate], stacked: RolloutBuffer | None = None
             ) -> None:
        """The arrays of this iteration's ``updates``: ``stacked``'s (the stacked buffer their
        rollouts are rows of, if any) where each row's field is its row, else copies."""
        weighted = any(u.batch.weight is not None for u in updates)
        self.arrays.pop("weight", None)
        for name in (*self.FIELDS, *(("weight",) if weighted else ())):
            xs = [self._field(u, name) for u in updates]
            whole = self._rows_in(stacked, name, updates, xs)
            if whole is not None:
                self.arrays[name] = whole
                self._owned.discard(name)
                continue
            a = self.arrays.get(name) if name in self._owned else None
            x0 = xs[0]
            if a is None or a.shape[1:] != tuple(x0.shape) or a.dtype != x0.numpy().dtype:
                a = self.arrays[name] = np.zeros((R, *x0.shape), x0.numpy().dtype)
                self._owned.add(name)
            for u, x in zip(updates, xs):
                a[u.row] = x.numpy()

    @classmethod
    def _rows_in(cls, stacked: RolloutBuffer | None, name: str, updates: list[RunUpdate],
                 xs: list[torch.Tensor]) -> np.ndarray | None:
        """``stacked``'s array of ``name`` as ``[R, B, ...]`` when each update's ``xs`` is its
        row of it (the same memory: a view), else None."""
        src = getattr(stacked, cls.STACKED.get(name, ""), None)
        if src is None:
            return None
        for u, x in zip(updates, xs):
            row = src[u.row]
            if not (x.data_ptr() == row.data_ptr() and x.numel() == row.numel()
                    and x.dtype == row.dtype and x.is_contiguous() and row.is_contiguous()):
                return None
        return src.numpy().reshape(src.shape[0], -1, *xs[0].shape[1:])

    @staticmethod
    def _field(u: RunUpdate, name: str) -> torch.Tensor:
        if name == "adv":
            return u.adv
        if name == "weight" and u.batch.weight is None:  # a row without weights: 1 (exact)
            return torch.ones(len(u.batch), dtype=torch.float32)
        return getattr(u.batch, name)

    def permute(self, active: list[RunUpdate]) -> None:
        """Gather the samples of the rows ``active`` in their epoch's order (``u.perm``): row
        ``a`` of ``epoch[name]`` is ``arrays[name][active[a].row][active[a].perm]``."""
        self.epoch_rows = tuple(u.row for u in active)
        if len(active) == 1:
            r, perm = active[0].row, active[0].perm
            self.perms = perm[None]
            self.epoch = {name: a[r].take(perm, 0)[None] for name, a in self.arrays.items()}
        else:
            rows = np.array(self.epoch_rows)
            perms = self.perms = np.stack([u.perm for u in active])
            B = self.arrays["obs"].shape[1]
            flat = (rows[:, None] * B + perms).ravel()
            self.epoch = {name: a.reshape(-1, *a.shape[2:]).take(flat, 0).reshape(
                *perms.shape, *a.shape[2:]) for name, a in self.arrays.items()}
        for a in self.epoch.values():
            a.flags.writeable = False  # minibatches are views of it: nothing may write them

    def minibatch(self, rows: np.ndarray, idx: np.ndarray, start: int) -> Minibatch:
        """Samples ``start:start + n`` of this epoch's order (``idx [A, n]``, their indices in
        the rollouts) of the stack rows ``rows``: views when they are the epoch's rows, else
        copies of theirs."""
        end = start + idx.shape[1]
        if tuple(rows.tolist()) == self.epoch_rows:
            g = {name: a[:, start:end] for name, a in self.epoch.items()}
        else:
            pos = np.array([self.epoch_rows.index(r) for r in rows.tolist()])
            g = {name: a[pos, start:end] for name, a in self.epoch.items()}
        return Minibatch(idx, g["obs"], g["actions"], g["params"], g["logp"], g["adv"],
                         g["returns"], g["values"], g.get("weight"))


def update_rows(stack: Stack, updates: list[RunUpdate], rollouts: Rollouts,
                ws: mlp.Workspace, stacked: RolloutBuffer | None = None
                ) -> list[UpdateResult | BaseException]:
    """Every update of one stack's rows (see the module docstring), from ``stacked`` where
    their rollouts are its rows (:meth:`Rollouts.fill`); per row its result, or the error that
    stopped it (a non-finite loss). The rows share epochs, batch and minibatch sizes (a
    stack's rows are grouped by them)."""
    rollouts.fill(stack.R, updates, stacked)
    cfg = updates[0].learner.cfg.ppo
    B, size = len(updates[0].batch), cfg.minibatch_size
    # a numpy stack of rows logs its steps stacked (its diagnostics read them) when every
    # minibatch has the same size; a run alone computes its own diagnostics from its steps
    log = StepLog(stack.R, cfg.update_epochs * (B // size), size) if (
        stack.fast and stack.R > 1 and B % size == 0) else None
    # rows without a minibatch early stop or before-step updates (an actuator, a band
    # controller) step on every minibatch of their epochs: no per-row check before a step
    plain = all(u.plain for u in updates)
    with validation(False):  # inputs come from checked rollouts; results are checked below
        for _epoch in range(cfg.update_epochs):
            active = [u for u in updates if not u.done]
            if not active:
                break
            for u in active:
                u.start_epoch()
            rollouts.permute(active)
            for start in range(0, B, size):
                if plain:  # every row steps on its next minibatch
                    stepping, idx = active, rollouts.perms[:, start:start + size]
                else:
                    stepping, idx = _checked(stack, active, rollouts, start, size), None
                if not stepping:
                    break
                _step(stack, stepping, rollouts, ws, start, log, idx)
            for u in active:
                u.end_epoch()
    diags = diagnostics_rows(updates, log)
    out: list[UpdateResult | BaseException] = []
    for u in updates:
        try:
            d = diags.get(u.row)
            if isinstance(d, FloatingPointError):
                raise d
            out.append(u.result(d))
        except (FloatingPointError, ValueError) as e:  # this row's loss became non-finite
            out.append(e)
    return out


def diagnostics_rows(updates: list[RunUpdate], log: StepLog | None = None
                     ) -> dict[int, dict[str, float] | FloatingPointError]:
    """The diagnostics of the rows that share a band and a number of samples and of loss terms,
    computed as one ``[A, N]`` computation per such family (each row's numbers are those it
    computes alone, ``tests/rl/test_engine.py``): stack row -> its diagnostics, or the error
    of a row whose loss became non-finite. A row in no family is left to itself. The steps'
    outputs are read from ``log`` when given, else concatenated from each row's steps."""
    families: dict[tuple[Any, ...], list[RunUpdate]] = {}
    for u in updates:
        band = u.learner.row_band
        if band is not None and u.steps:
            s0 = u.steps[0]
            key = (band, sum(len(r.idx) for r in u.steps), len(u.steps), tuple(s0.terms),
                   tuple(s0.samples))
            families.setdefault(key, []).append(u)
    out: dict[int, dict[str, float] | FloatingPointError] = {}
    for (band, *_), fam in families.items():
        if len(fam) == 1:
            continue
        with torch.no_grad(), validation(False):
            if log is None:
                cat, s = step_parts([r for u in fam for r in u.steps], rows=len(fam))
                idx = cat["idx"]
                logp_old = torch.stack([u.batch.logp[idx[a]] for a, u in enumerate(fam)])
            else:
                cat, s, logp_old = _logged_parts(log, fam)
            ok = torch.isfinite(cat["loss"]).all(-1).tolist()
            d = {k: v.tolist() for k, v in diagnostic_stats(band, cat, s, logp_old).items()}
        for a, u in enumerate(fam):
            out[u.row] = ({k: v[a] for k, v in d.items()} if ok[a]
                          else FloatingPointError(NON_FINITE))
    return out


def _probed(k3: float | None) -> float:
    """The k3 a probing row's minibatch check reads (computed for every probing row)."""
    assert k3 is not None, "a row with the minibatch early stop was not probed"
    return k3


def _checked(stack: Stack, active: list[RunUpdate], rollouts: Rollouts, start: int,
             size: int) -> list[RunUpdate]:
    """The rows of ``active`` that step on the minibatch at ``start``: each row's check
    (:meth:`RunUpdate.skips`), the k3 of every probing row from one stacked forward first."""
    rows = [u for u in active if u.in_epoch]
    probing = [u for u in rows if u.probes]
    k3s: dict[int, float] = {}
    if probing:
        at = rollouts.rows_of(probing)
        pos = [rollouts.epoch_rows.index(u.row) for u in probing]
        idx = rollouts.perms[pos, start:start + size]
        k3s = dict(zip(at.tolist(), stack.probe_k3(at, idx, rollouts.minibatch(at, idx,
                                                                              start))))
    return [u for u in rows if not u.skips(start, size, k3s.get(u.row))]


def _logged_parts(log: StepLog, fam: list[RunUpdate]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """:func:`step_parts` of a family's rows and their rollout log-probabilities, from the
    step log (each row's numbers those its steps computed)."""
    s0 = fam[0].steps[0]
    keep = [k for k in STEP_OUTPUTS if k != "idx"]
    got = log.rows(np.array([u.row for u in fam]), (*keep, *s0.terms, *s0.samples, "logp_old"),
                   len(fam[0].steps))
    t = {k: torch.from_numpy(v) for k, v in got.items()}
    return ({k: t[k] for k in (*keep, *s0.terms)}, {k: t[k] for k in s0.samples},
            t["logp_old"])


def _step(stack: Stack, stepping: list[RunUpdate], rollouts: Rollouts, ws: mlp.Workspace,
          start: int, log: StepLog | None, idx: np.ndarray | None) -> None:
    """One step of the rows ``stepping`` on their minibatch at ``start``: ``idx [A, n]``, or
    each one's ``u.idx`` (set by :meth:`RunUpdate.skips`)."""
    rows = rollouts.rows_of(stepping)
    if idx is None:
        idx = stepping[0].idx[None] if len(stepping) == 1 else np.stack([u.idx for u in stepping])
    mb = rollouts.minibatch(rows, idx, start)
    losses, betas = [u.learner.loss for u in stepping], [u.sched.beta() for u in stepping]
    results = (stack.step(rows, mb, losses, betas, ws) if log is None
               else stack.step(rows, mb, losses, betas, ws, log))
    for u, r in zip(stepping, results):
        u.steps.append(r)
        u.sched.after_step(r, len(r.idx))


def policy_kls(stack: Stack, updates: list[RunUpdate], rollouts: Rollouts,
               ws: mlp.Workspace) -> list[float]:
    """Each row's rollout KL after its update: analytic KL(rollout policy || updated policy),
    mean over the rollout (nats per sample), from one stacked forward."""
    rows = np.array([u.row for u in updates])
    obs, params = rollouts.arrays["obs"], rollouts.arrays["params"]
    if len(rows) != stack.R:
        obs, params = obs[rows], params[rows]
    return stack.policy_kl(rows, obs, params, ws)
