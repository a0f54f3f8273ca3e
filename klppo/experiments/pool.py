"""The local process pool of experiments: at most N worker processes, stoppable.

Used by sweeps (:mod:`klppo.experiments.sweep`) and by the RLHF comparison
(:mod:`klppo.experiments.rlhf_compare`): each run directory is one worker process
(:mod:`klppo.experiments.launch`), all started and watched from the calling thread.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from klppo.experiments import launch as L
from klppo.runs import rundir as R

log = logging.getLogger(__name__)

__all__ = ["SweepStop", "signals_to", "run_local", "Done", "BUSY_WAIT_S"]

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


class _Local:
    """At most ``workers`` worker processes, all started and watched from the one thread that
    runs the sweep (a worker's parent-death signal fires when the thread that forked it ends)."""

    def __init__(self, dirs: dict[str, str], workers: int, update: Done, stop: SweepStop):
        self.queue = deque(dirs.items())
        self.workers, self.update, self.stop = workers, update, stop
        self.jobs: dict[str, L.Job] = {}
        self.busy_since: dict[str, float] = {}

    def launch(self) -> None:
        deferred = []
        while self.queue and len(self.jobs) < self.workers:
            name, run_dir = self.queue.popleft()
            holder = _busy(run_dir)
            if holder is None:
                self.jobs[name] = L.start(run_dir)
                self.update(name, {"state": "running"})
            elif self.gave_up(name, holder):
                self.update(name, {"state": "failed", "error": holder})
            else:
                deferred.append((name, run_dir))
        self.queue.extend(deferred)

    def gave_up(self, name: str, holder: str) -> bool:
        now = time.monotonic()
        if name not in self.busy_since:
            self.busy_since[name] = now
            log.warning("%s; the sweep waits for it (up to %.0f s)", holder, BUSY_WAIT_S)
        return now - self.busy_since[name] > BUSY_WAIT_S

    def reap(self) -> None:
        for name, job in list(self.jobs.items()):
            L.stop(job, min(self.stop.requests, 2))
            rc = job.proc.poll()
            if rc is not None:
                del self.jobs[name]
                self.update(name, L.outcome(job, rc))

    def run(self) -> None:
        try:
            while self.jobs or (self.queue and not self.stop.requests):
                if not self.stop.requests:
                    self.launch()
                self.reap()
                time.sleep(POLL_S)
        finally:  # on an error of our own: stop the workers the graceful way, then re-raise
            for job in self.jobs.values():
                L.stop(job, 1)
            for job in self.jobs.values():
                job.proc.wait()


def run_local(dirs: dict[str, str], workers: int, update: Done, stop: SweepStop) -> None:
    _Local(dirs, workers, update, stop).run()


