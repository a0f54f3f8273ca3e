"""THE run loop: every run klppo trains iterates here, alone (:func:`run_iterations`: ``klppo
train``, ``klppo rlhf``) or in a group that computes one iteration of each run in one call
(:func:`run_group`: the engine's groups, :mod:`klppo.rl.engine`). A run alone is a group of one.

Each run has its own directory, lock, status.json, metrics, checkpoint cadence and warnings
(:mod:`klppo.runs.lifecycle`: :func:`~klppo.runs.lifecycle.record` after each iteration,
:func:`~klppo.runs.lifecycle.fail` on an error). A run that fails ends alone (status 'failed'
with its reason and the checkpoint kept); the others go on. A first SIGINT / SIGTERM lets every
run finish the iteration, checkpoint and end 'interrupted'; a second ends them at once. An
``on_iteration`` callback may end a run as another state with :class:`StopRun` (a tuner's
'pruned'), checkpointed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from klppo.runs import metrics as M
from klppo.runs.atomic import atomic_write_all
from klppo.runs.errors import RunFailed, RunInterrupted
from klppo.runs.lifecycle import (
    OnIteration,
    RunLife,
    StopRun,
    Trainer,
    checkpoint_due,
    fail,
    record,
)
from klppo.runs.signals import StopRequest

log = logging.getLogger(__name__)

__all__ = ["IterateAll", "run_group", "run_iterations"]

#: one iteration of each run named by index; per run its metrics or the error that stopped it
IterateAll = Callable[[list[int]], list[dict[str, Any] | BaseException]]


class _Group:
    """The runs' writers and end states while they iterate."""

    def __init__(self, trainers: Sequence[Trainer], lives: Sequence[RunLife]) -> None:
        self.trainers, self.lives = trainers, lives
        self.states: list[str] = ["pending"] * len(trainers)
        self.errors: list[str | None] = [None] * len(trainers)
        self.writers: dict[int, M.MetricsWriter] = {}

    def live(self) -> list[int]:
        return [i for i, s in enumerate(self.states) if s == "running"]

    def end(self, i: int, state: str, error: BaseException | None = None, it: int = 0,
            note: str | None = None, **fields: Any) -> None:
        """End run ``i``: close its metrics, write its status (a failure's reason for ``error``
        during iteration ``it``; ``note`` for an abrupt end; ``fields`` such as a stop's
        reason), then close its trainer and release its lock. The status comes before the
        trainer's close, so a second signal while the envs close cannot leave it 'running'."""
        tr, life = self.trainers[i], self.lives[i]
        try:
            try:
                writer = self.writers.pop(i, None)
                if writer is not None:
                    writer.close()
                if error is None and note is None:
                    life.status(state, tr.iteration, **fields)
            except Exception as e:  # noqa: BLE001 - e.g. a full disk: the run fails with it
                error, it = (error, it) if error is not None else (e, tr.iteration)
            if error is not None:
                state = "failed"
                self.errors[i] = fail(life, tr.iteration, it, error)
            elif note is not None:
                life.final_status(state, tr.iteration, error=note)
        except KeyboardInterrupt:  # a second signal before the status was written
            state = "interrupted"
            life.final_status(state, tr.iteration, error="interrupted at once (second signal)")
            raise
        finally:
            self.states[i] = state
            try:
                tr.close()
            except Exception:  # noqa: BLE001 - its status is written; the others go on
                log.exception("%s: closing the run failed", life.run_dir)
            finally:
                life.lock.release()


def run_group(trainers: Sequence[Trainer], lives: Sequence[RunLife], iterate_all: IterateAll,
              make_writer: Callable[[int], M.MetricsWriter],
              on_iteration: OnIteration = None) -> tuple[list[str], list[str | None]]:
    """Iterate every run to its end, a stop request, a :class:`StopRun` or its failure; return
    each run's end state ('finished', 'interrupted', 'failed' or a StopRun's) and error (the
    one-line reason of a failed run; the exception is ``lives[i].failure``).

    ``make_writer(i)`` opens run i's metrics sinks. An error of ``iterate_all`` itself (not of
    one run) fails every run still iterating with that reason. Locks are released and trainers
    closed however the runs end; a second signal ends them 'interrupted' and re-raises."""
    g = _Group(trainers, lives)
    stop = StopRequest()
    try:
        with stop:
            _start(g, trainers, lives, make_writer)
            _iterate(g, iterate_all, on_iteration, stop)
    except KeyboardInterrupt:
        for i in g.live():
            lives[i].stop_signal = stop.signum
            g.end(i, "interrupted", note="interrupted at once (second signal)")
        raise
    except Exception as e:  # noqa: BLE001 - the engine itself failed: every live run with it
        for i in g.live():
            g.end(i, "failed", e, trainers[i].iteration + 1)
    finally:
        for i in g.live():  # only on an exit not handled above (e.g. SystemExit)
            g.end(i, "interrupted")
    return g.states, g.errors


def _start(g: _Group, trainers: Sequence[Trainer], lives: Sequence[RunLife],
           make_writer: Callable[[int], M.MetricsWriter]) -> None:
    """Each run 'running' with its metrics sinks open (a run that cannot log fails alone)."""
    for i, (tr, life) in enumerate(zip(trainers, lives)):
        g.states[i] = "running"
        try:
            life.status("running", tr.iteration)
            g.writers[i] = make_writer(i)
        except Exception as e:  # noqa: BLE001 - this run cannot log: it alone fails
            g.end(i, "failed", e, tr.iteration + 1)


def _iterate(g: _Group, iterate_all: IterateAll, on_iteration: OnIteration,
             stop: StopRequest) -> None:
    for i in g.live():
        if g.trainers[i].iteration >= g.trainers[i].num_iterations:
            g.end(i, "finished")
    while g.live():
        live = g.live()
        for i, res in zip(live, iterate_all(live)):
            tr = g.trainers[i]
            if isinstance(res, BaseException):
                g.end(i, "failed", res, tr.iteration + 1)
                continue
            try:
                record(tr, g.lives[i], g.writers[i], res, on_iteration)
            except StopRun as request:
                _stop_run(g, i, request)
            except Exception as e:  # noqa: BLE001 - one run's failure ends that run
                g.end(i, "failed", e, tr.iteration)
        _checkpoint(g, [i for i in g.live() if checkpoint_due(g.trainers[i], stop)])
        for i in g.live():
            if g.trainers[i].iteration >= g.trainers[i].num_iterations:
                g.end(i, "finished")
        if stop.requested:  # (it may have come while the due checkpoints were written)
            _checkpoint(g, [i for i in g.live() if g.lives[i].saved != g.trainers[i].iteration])
            for i in g.live():
                g.lives[i].stop_signal = stop.signum
                g.end(i, "interrupted")


def _checkpoint(g: _Group, due: list[int]) -> None:
    """The checkpoints of the runs ``due``, written together (each file atomically, their
    fsyncs side by side); a run whose checkpoint cannot be made or written fails alone."""
    sets: dict[int, list[tuple[Path, bytes]]] = {}
    for i in due:
        try:
            sets[i] = g.trainers[i].checkpoint(g.lives[i].run_dir)
        except Exception as e:  # noqa: BLE001 - e.g. the policy export on a full disk
            g.end(i, "failed", e, g.trainers[i].iteration)
    for i, error in zip(sets, atomic_write_all(list(sets.values()))):
        if error is not None:
            g.end(i, "failed", error, g.trainers[i].iteration)
        else:
            g.lives[i].saved = g.trainers[i].iteration


def _stop_run(g: _Group, i: int, request: StopRun) -> None:
    """End run ``i`` as an ``on_iteration`` callback asked, checkpointed (the callback came
    before the cadence's checkpoint); at its last iteration it is simply 'finished'."""
    tr = g.trainers[i]
    _checkpoint(g, [i])  # a checkpoint that fails fails the run
    if g.states[i] != "running":
        return
    if tr.iteration < tr.num_iterations:
        g.end(i, request.state, reason=request.reason)
    else:
        g.end(i, "finished")


def run_iterations(tr: Trainer, life: RunLife, make_writer: Callable[[], M.MetricsWriter],
                   on_iteration: OnIteration, failed: type[RunFailed]) -> str:
    """A run alone (a group of one): iterate ``tr`` to its end or a stop request; return
    'finished', 'interrupted' (the signal in ``life.stop_signal``) or the state of a
    :class:`StopRun`. A second signal raises :class:`~klppo.runs.errors.RunInterrupted` (a
    ``KeyboardInterrupt``) naming the directory; a failure (status 'failed' with its reason,
    traceback and the checkpoint kept) raises ``failed`` with the one-line reason."""

    def iterate_one(live: list[int]) -> list[dict[str, Any] | BaseException]:
        try:
            return [tr.iterate()]
        except Exception as e:  # noqa: BLE001 - the run's failure, recorded by the loop
            return [e]

    try:
        states, errors = run_group([tr], [life], iterate_one, lambda i: make_writer(),
                                   on_iteration)
    except KeyboardInterrupt:
        raise RunInterrupted(life.run_dir, life.stop_signal) from None
    if states[0] == "failed":
        raise failed(errors[0] or "failed") from life.failure
    return states[0]
