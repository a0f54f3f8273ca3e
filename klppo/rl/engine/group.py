"""One iteration of a group of runs: THE training iteration of klppo (a plain run is a group
of one).

A group's members are trainers (:class:`klppo.rl.trainer.SingleTrainer`, or a multi-agent
:class:`klppo.rl.marl.trainer.MultiTrainer`, whose every policy is a row); each policy of each
member is a row of a stack (:mod:`~klppo.rl.engine.numpy_stack`,
:mod:`~klppo.rl.engine.torch_stack`). :meth:`Group.iterate` computes one iteration of the members
asked for, in the visible phases of a PPO iteration:

1. learning rates (the schedule's, or the lr actuator's);
2. collection: single-agent runs of one stack in lock step (:func:`~.collect.collect_rows`: one
   stacked forward per env step), a multi-agent run over its own env loop; a policy with
   ``ppo.staleness`` k collects with its policy k updates back (:meth:`Group.collect`);
3. advantages (GAE once per group of rollouts of one shape:
   :func:`~.advantages.group_gae`; a stale rollout's proximal policy and weights:
   :meth:`klppo.rl.unit.PolicyUnit.proximal`), then the update of every row of each stack
   together (:func:`~.learn.update_rows`);
4. each row's rollout KL from one stacked forward, and its iteration-cadence controller update;
5. each member's metrics (:meth:`klppo.rl.unit.PolicyUnit.report`).

An error in one member (its env, a non-finite loss) ends that member alone: it is returned in
its place and the others go on.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from klppo.nn.numpy import mlp
from klppo.rl.engine.advantages import group_gae
from klppo.rl.engine.collect import collect_rows
from klppo.rl.engine.learn import Rollouts, RunUpdate, policy_kls, update_rows
from klppo.rl.envpool_backend import EnvPoolGroup
from klppo.rl.rollout import stacked_of

if TYPE_CHECKING:
    from klppo.rl.config import TrainConfig

__all__ = ["Group"]


class GroupMember(Protocol):
    """What a :class:`Group` uses of its members (typed for mypy): a single-agent run
    (``lockstep``: its rows act with the stack's) or a multi-agent one (not lockstep: it has
    its own ``collect(iteration)``)."""

    cfg: TrainConfig
    env: Any
    collector: Any
    group: Any
    group_index: int
    iteration: int
    global_step: int

    @property
    def num_iterations(self) -> int: ...

    @property
    def lockstep(self) -> bool: ...

    @property
    def policy_units(self) -> list[Any]: ...

    def start_iteration(self, it: int) -> Any: ...

    def rollouts(self, episodes: Any) -> list[tuple[str, Any, Any]]: ...

    def iteration_metrics(self, it: int, episodes: Any, reports: dict[str, dict[str, Any]],
                          lr: Any) -> dict[str, Any]: ...

    def close(self) -> None: ...


class _StackWork:
    """What a stack keeps between iterations: its update rollouts and workspace, and its
    collection state."""

    def __init__(self) -> None:
        self.rollouts, self.ws = Rollouts(), mlp.Workspace()
        self.collect: dict[str, Any] = {}  # the lock-step collection's stacked state


@contextmanager
def _stale_policies(trainers: Iterable[GroupMember]) -> Iterator[None]:
    """Every policy with ``ppo.staleness`` acts with its policy k updates back inside the
    block (:meth:`klppo.rl.unit.PolicyUnit.act_stale`); its current weights are back after
    it, however the block ends."""
    back: list[tuple[Any, Any]] = []
    try:
        for tr in trainers:
            for unit in tr.policy_units:
                now = unit.act_stale()
                if now is not None:
                    back.append((unit, now))
        yield
    finally:
        for unit, now in back:
            unit.learner.backend.load_policy_weights(now)


class Group:
    """The members that iterate together (see the module docstring); ``members[i]`` is member
    ``i`` of :meth:`iterate`."""

    def __init__(self, members: list[GroupMember]) -> None:
        self.members = members
        self.work: dict[int, _StackWork] = defaultdict(_StackWork)
        self.clock: tuple[float, list[int]] | None = None
        for i, tr in enumerate(members):
            tr.group, tr.group_index = self, i
        self._pool_envpool()

    def _pool_envpool(self) -> None:
        """The single-agent members on EnvPool share one pool per task (EnvPool seeds each env
        as the run's own pool would: :class:`~klppo.rl.envpool_backend.EnvPoolGroup`)."""
        by_task: dict[str, list[GroupMember]] = defaultdict(list)
        for tr in self.members:
            if tr.lockstep and tr.cfg.rollout.env_backend == "envpool":
                by_task[tr.cfg.env].append(tr)
        for trs in by_task.values():
            pool = EnvPoolGroup.adopt([tr.env for tr in trs], trs[0].cfg.envpool_threads)
            if pool is not None:
                for tr, piece in zip(trs, pool.slices):
                    tr.env = tr.collector.env = piece

    def iterate(self, which: list[int]) -> list[dict[str, Any] | BaseException]:
        """One iteration of each member in ``which``; per member its metrics or the error that
        stopped it."""
        if self.clock is None:
            self.clock = (time.perf_counter(), [tr.global_step for tr in self.members])
        trs = {i: self.members[i] for i in which}
        its = {i: tr.iteration + 1 for i, tr in trs.items()}
        lrs = {i: tr.start_iteration(its[i]) for i, tr in trs.items()}       # 1. learning rates
        t0 = time.perf_counter()
        out: dict[int, Any] = self.collect(trs, its)                          # 2. collect
        episodes = {i: e for i, e in out.items() if not isinstance(e, BaseException)}
        for i in episodes:
            trs[i].global_step += trs[i].cfg.batch_size
        t1 = time.perf_counter()
        reports = self._learn({i: trs[i] for i in episodes}, episodes, its)    # 3-4. learn
        out.update({i: e for i, e in reports.items() if isinstance(e, BaseException)})
        t2 = time.perf_counter()
        n = max(1, len(trs))
        for i, rep in reports.items():                                          # 5. log
            if isinstance(rep, BaseException):
                continue
            tr = trs[i]
            tr.iteration = its[i]
            m = tr.iteration_metrics(its[i], episodes[i], rep, lrs[i])
            m.update(time_collect=(t1 - t0) / n, time_update=(t2 - t1) / n)
            out[i] = self._timed(m, i)
        return [out[i] for i in which]

    def _timed(self, m: dict[str, Any], i: int) -> dict[str, Any]:
        """``time_elapsed`` since the group started iterating and the run's ``sps`` over it (its
        own steps: the group's rate is the sum over its runs)."""
        assert self.clock is not None  # (set by iterate)
        start, steps = self.clock
        elapsed = time.perf_counter() - start
        m["time_elapsed"] = elapsed
        m["sps"] = (self.members[i].global_step - steps[i]) / max(elapsed, 1e-9)
        return m

    def collect(self, trs: dict[int, Any], its: dict[int, int]) -> dict[int, Any]:
        """Each member's rollout: single-agent runs of one stack in lock step, a multi-agent
        run alone; a policy with ``ppo.staleness`` k collects with its policy k updates back."""
        with _stale_policies(trs.values()):
            return self._collect(trs, its)

    def _collect(self, trs: dict[int, Any], its: dict[int, int]) -> dict[int, Any]:
        out: dict[int, Any] = {}
        lockstep: dict[int, dict[int, tuple[int, Any]]] = defaultdict(dict)
        stacks: dict[int, Any] = {}
        for i, tr in trs.items():
            if tr.lockstep:
                slot = tr.unit.learner.backend
                lockstep[id(slot.stack)][slot.row] = (i, tr)
                stacks[id(slot.stack)] = slot.stack
                continue
            try:
                out[i] = tr.collect(its[i])
            except Exception as e:  # noqa: BLE001 - this run's env failed: it alone stops
                out[i] = e
        for key, rows in lockstep.items():
            res = collect_rows(stacks[key], {r: tr.collector for r, (_, tr) in rows.items()},
                               {r: its[i] for r, (i, _) in rows.items()}, self.work[key].collect)
            out.update({rows[r][0]: e for r, e in res.items()})
        return out

    def _learn(self, trs: dict[int, Any], episodes: dict[int, Any],
               its: dict[int, int]) -> dict[int, Any]:
        """Advantages, every stack's update, the rollout KLs and controllers, and each member's
        policy reports (``{policy name: metrics}``) or the error that stopped it."""
        errors: dict[int, BaseException] = {}
        rolls: list[tuple[int, str, Any, Any]] = []
        for i, tr in trs.items():
            try:
                rolls += [(i, name, unit, buf) for name, unit, buf in tr.rollouts(episodes[i])]
            except Exception as e:  # noqa: BLE001 - this run's rollout: it alone stops
                errors[i] = e
        gaes = group_gae([(unit.cfg.ppo, buf) for _, _, unit, buf in rolls])
        by_stack: dict[int, list[tuple[int, str, Any, Any, RunUpdate]]] = defaultdict(list)
        for (i, name, unit, buf), err in zip(rolls, gaes):
            try:
                if err is not None:  # its rollout's GAE failed
                    raise err
                if i not in errors:
                    u = RunUpdate(unit.learner, unit.proximal(unit.batch(buf)))
                    by_stack[id(u.stack)].append((i, name, unit, buf, u))
            except Exception as e:  # noqa: BLE001 - this run's rollout: it alone stops
                errors[i] = e
        reports: dict[int, dict[str, Any]] = defaultdict(dict)
        for key, entries in by_stack.items():
            entries = [e for e in entries if e[0] not in errors]
            if not entries:
                continue
            work, stack = self.work[key], entries[0][4].stack
            updates = [u for *_, u in entries]
            results = update_rows(stack, updates, work.rollouts, work.ws,
                                  stacked_of([buf for *_, buf, _ in entries]))
            kls = policy_kls(stack, updates, work.rollouts, work.ws)
            for (i, name, unit, _, u), res, kl in zip(entries, results, kls):
                if i in errors:
                    continue
                try:
                    if isinstance(res, BaseException):
                        raise res
                    unit.remember()
                    u.sched.after_iteration(kl, len(u.batch))
                    reports[i][name] = unit.report(u.batch, res, kl, u.sched.updates, its[i])
                except Exception as e:  # noqa: BLE001 - this run's update or controller
                    errors[i] = e
        return {i: errors.get(i, reports.get(i, {})) for i in trs}
