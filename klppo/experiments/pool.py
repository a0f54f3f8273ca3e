"""The local process pool of experiments: at most N worker processes, stoppable.

Used by sweeps (:mod:`klppo.experiments.sweep`) and by the RLHF comparison
(:mod:`klppo.experiments.rlhf_compare`): each run directory is one worker process
(:mod:`klppo.experiments.launch`), or each group of them (one engine group), all started
and watched from the calling thread.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from klppo.experiments import launch as L
from klppo.runs import rundir as R

log = logging.getLogger(__name__)

__all__ = ["SweepStop", "signals_to", "run_local", "units", "Done", "BUSY_WAIT_S"]

Done = Callable[[str, dict[str, Any]], None]

#: how long a run whose directory another process holds is retried before it counts as failed
BUSY_WAIT_S = 300.0
POLL_S = 0.05


class SweepStop:
    """Asks a running sweep to stop: the first request stops launching runs and asks the running
    ones to checkpoint and stop; the second kills them. Thread- and signal-handler-safe."""

    def __init__(self) -> None:
        self.requests = 0
        self.signal: int | None = None

    def request(self, signum: int | None = None) -> None:
        self.requests += 1
        if self.signal is None:
            self.signal = signum
        log.warning("%s: %s", signal.Signals(signum).name if signum else "stop requested",
                    "no new runs; running runs checkpoint and stop (again: kill them)"
                    if self.requests == 1 else "killing the running runs")


@contextlib.contextmanager
def signals_to(stop: SweepStop) -> Iterator[None]:
    """SIGINT and SIGTERM request a stop while the sweep runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, lambda signum, frame: stop.request(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _busy(run_dir: str) -> str | None:
    """The holder of ``run_dir``'s lock (e.g. a worker of a killed sweep, still stopping)."""
    try:
        R.DirLock(run_dir).acquire().release()
    except R.DirBusyError as e:
        return str(e)
    return None


#: runs launched together: (name, run directory) of each; one run is an ordinary worker
Unit = list[tuple[str, str]]


def units(dirs: dict[str, str], groups: list[list[str]] | None) -> list[Unit]:
    """The launch units of ``dirs`` in their order: each group (names of ``dirs``, launched
    together when it holds more than one) where its first run comes, every other run alone."""
    grouped = {n: i for i, g in enumerate(groups or []) for n in g if n in dirs}
    out: list[Unit] = []
    seen: set[int] = set()
    for name, run_dir in dirs.items():
        if name not in grouped:
            out.append([(name, run_dir)])
        elif grouped[name] not in seen:
            seen.add(grouped[name])
            out.append([(n, dirs[n]) for n in (groups or [])[grouped[name]] if n in dirs])
    return out


class _Local:
    """At most ``workers`` worker processes, all started and watched from the one thread that
    runs the sweep (a worker's parent-death signal fires when the thread that forked it ends)."""

    def __init__(self, todo: list[Unit], workers: int, update: Done, stop: SweepStop):
        self.queue = deque(todo)
        self.workers, self.update, self.stop = workers, update, stop
        self.jobs: dict[str, tuple[L.Job, Unit]] = {}
        self.busy_since: dict[str, float] = {}

    def launch(self) -> None:
        deferred = []
        while self.queue and len(self.jobs) < self.workers:
            unit = self.queue.popleft()
            name = unit[0][0]
            holder = next((h for h in (_busy(d) for _, d in unit) if h is not None), None)
            if holder is None:
                dirs = [d for _, d in unit]
                self.jobs[name] = (L.start(dirs[0]) if len(unit) == 1 else L.start_group(dirs),
                                   unit)
                for n, _ in unit:
                    self.update(n, {"state": "running"})
            elif self.gave_up(name, holder):
                for n, _ in unit:
                    self.update(n, {"state": "failed", "error": holder})
            else:
                deferred.append(unit)
        self.queue.extend(deferred)

    def gave_up(self, name: str, holder: str) -> bool:
        now = time.monotonic()
        if name not in self.busy_since:
            self.busy_since[name] = now
            log.warning("%s; the sweep waits for it (up to %.0f s)", holder, BUSY_WAIT_S)
        return now - self.busy_since[name] > BUSY_WAIT_S

    def reap(self) -> None:
        for name, (job, unit) in list(self.jobs.items()):
            L.stop(job, min(self.stop.requests, 2))
            rc = job.proc.poll()
            if rc is not None:
                del self.jobs[name]
                for n, d in unit:
                    self.update(n, L.outcome(job, rc, Path(d)))

    def run(self) -> None:
        try:
            while self.jobs or (self.queue and not self.stop.requests):
                if not self.stop.requests:
                    self.launch()
                self.reap()
                time.sleep(POLL_S)
        finally:  # on an error of our own: stop the workers the graceful way, then re-raise
            for job, _ in self.jobs.values():
                L.stop(job, 1)
            for job, _ in self.jobs.values():
                job.proc.wait()


def run_local(dirs: dict[str, str], workers: int, update: Done, stop: SweepStop,
              groups: list[list[str]] | None = None) -> None:
    """Run ``dirs`` (name -> run directory, in launch order) in at most ``workers`` processes;
    the names of each of ``groups`` share one batched worker."""
    _Local(units(dirs, groups), workers, update, stop).run()


