"""The run lifecycle (:mod:`klppo.runs.lifecycle`) for several runs that iterate together.

The engine (:mod:`klppo.rl.engine`) computes one iteration of each run of a group in one
call. Each run still has its own directory, lock, status.json, metrics, checkpoint cadence and
warnings, exactly as :func:`~klppo.runs.lifecycle.run_iterations` gives a run of its own: the
same :func:`~klppo.runs.lifecycle.record` after each iteration, the same :func:`fail` on an
error. A run that fails ends alone (status 'failed' with its reason); the others go on. A first
SIGINT / SIGTERM lets every run finish the iteration, checkpoint and end 'interrupted'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from klppo.runs import metrics as M
from klppo.runs.lifecycle import OnIteration, RunLife, Trainer, fail, record
from klppo.runs.signals import StopRequest

log = logging.getLogger(__name__)

__all__ = ["IterateAll", "run_group"]

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
            note: str | None = None) -> None:
        """End run ``i``: close its writer and trainer, write its status (a failure's reason
        for ``error`` during iteration ``it``, or ``note``), release its lock."""
        tr, life = self.trainers[i], self.lives[i]
        self.states[i] = state
        try:
            writer = self.writers.pop(i, None)
            if writer is not None:
                writer.close()
            tr.close()
        finally:
            try:
                if error is not None:
                    self.errors[i] = fail(life, tr.iteration, it, error)
                elif note is not None:
                    life.final_status(state, tr.iteration, error=note)
                else:
                    life.status(state, tr.iteration)
            finally:
                life.lock.release()


def run_group(trainers: Sequence[Trainer], lives: Sequence[RunLife], iterate_all: IterateAll,
              make_writer: Callable[[int], M.MetricsWriter],
              on_iteration: OnIteration = None) -> tuple[list[str], list[str | None]]:
    """Iterate every run to its end, a stop request or its failure; return each run's end state
    ('finished', 'interrupted' or 'failed') and error (the one-line reason of a failed run).

    ``make_writer(i)`` opens run i's metrics sinks. An error of ``iterate_all`` itself (not of
    one run) fails every run still iterating with that reason. Locks are released and trainers
    closed however the runs end; a second signal ends them 'interrupted' and re-raises."""
    g = _Group(trainers, lives)
    for i, (tr, life) in enumerate(zip(trainers, lives)):
        g.states[i] = "running"
        try:
            life.status("running", tr.iteration)
            g.writers[i] = make_writer(i)
        except Exception as e:  # noqa: BLE001 - this run cannot log: it alone fails
            g.end(i, "failed", e, tr.iteration + 1)
    try:
        with StopRequest() as stop:
            _iterate(g, iterate_all, on_iteration, stop)
    except KeyboardInterrupt:
        for i in g.live():
            g.end(i, "interrupted", note="interrupted at once (second signal)")
        raise
    except Exception as e:  # noqa: BLE001 - the engine itself failed: every live run with it
        for i in g.live():
            g.end(i, "failed", e, trainers[i].iteration + 1)
    finally:
        for i in g.live():  # only on an exit not handled above (e.g. SystemExit)
            g.end(i, "interrupted")
    return g.states, g.errors


def _iterate(g: _Group, iterate_all: IterateAll, on_iteration: OnIteration,
             stop: StopRequest) -> None:
    for i in g.live():
        if g.trainers[i].iteration >= g.trainers[i].num_iterations:
            g.end(i, "finished")
    while g.live():
        live = g.live()
        results = iterate_all(live)
        for i, res in zip(live, results):
            tr = g.trainers[i]
            if isinstance(res, BaseException):
                g.end(i, "failed", res, tr.iteration + 1)
                continue
            try:
                record(tr, g.lives[i], g.writers[i], res, on_iteration, stop)
            except Exception as e:  # noqa: BLE001 - one run's failure ends that run
                g.end(i, "failed", e, tr.iteration)
                continue
            if tr.iteration >= tr.num_iterations:
                g.end(i, "finished")
        if stop.requested:
            for i in g.live():
                g.end(i, "interrupted")
