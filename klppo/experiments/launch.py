"""Worker processes of a sweep: start one run, stop it, and say how it ended.

Each run is ``python -m klppo.experiments.worker RUN_DIR`` in its own session (so a Ctrl-C at the
terminal reaches only the sweep, which decides what the workers get), with its output appended
to ``RUN_DIR/worker.log``. A group of runs (the default; ``--group-size`` caps it) is one worker for
several run directories (``python -m klppo.experiments.worker --batched RUN_DIR...``, one group of
the engine, :mod:`klppo.rl.engine`), its output in the first run's ``worker.log`` (each other
run's says where); how each of its runs ended is read from that run's own status. The worker
stops itself if the sweep dies (see ``klppo.experiments.worker``).
Stopping a job: level 1 sends SIGINT (finish the iteration, checkpoint, status 'interrupted'),
level 2 sends SIGKILL (the run resumes from its last checkpoint).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klppo.runs import rundir as R

__all__ = ["PARENT_ENV", "BUSY_EXIT", "Job", "start", "start_group", "stop", "outcome",
           "outcomes", "run_one", "run_group"]

#: environment variable naming the pid the worker must not outlive
PARENT_ENV = "KLPPO_PARENT_PID"
#: worker exit code: another process holds the run directory (its status is not ours to touch)
BUSY_EXIT = 75
LOG = "worker.log"


@dataclass
class Job:
    run_dir: Path
    proc: subprocess.Popen
    started: float
    """time.time() at launch (status.json files older than this are from an earlier launch)"""
    log_offset: int
    stop_level: int = 0
    members: list[Path] = field(default_factory=list)
    """the run directories of a batched group (its log is the first one's); empty: run_dir"""

    @property
    def run_dirs(self) -> list[Path]:
        return self.members or [self.run_dir]


def _launch(args: list[str], log_dir: Path) -> tuple[subprocess.Popen, float, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           PARENT_ENV: str(os.getpid())}
    started = time.time()
    with open(log_dir / LOG, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen([sys.executable, "-m", "klppo.experiments.worker", *args],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    return proc, started, offset


def start(run_dir: str | Path) -> Job:
    """Launch the worker of ``run_dir``; returns at once."""
    run_dir = Path(run_dir)
    return Job(run_dir, *_launch([str(run_dir)], run_dir))


def start_group(run_dirs: Sequence[str | Path]) -> Job:
    """Launch one batched worker for ``run_dirs``; returns at once."""
    dirs = [Path(d) for d in run_dirs]
    for d in dirs[1:]:
        with open(d / LOG, "a") as f:
            f.write(f"trained in one process of {len(dirs)} runs (a group); its "
                    f"log: {dirs[0] / LOG}\n")
    return Job(dirs[0], *_launch(["--batched", *map(str, dirs)], dirs[0]), members=dirs)


def stop(job: Job, level: int) -> None:
    """Raise the job's stop level: 1 = SIGINT (checkpoint and stop), 2 = SIGKILL."""
    if level <= job.stop_level or job.proc.returncode is not None:
        return
    job.stop_level = level
    try:
        job.proc.send_signal(signal.SIGINT if level == 1 else signal.SIGKILL)
    except ProcessLookupError:
        pass


def _log_tail(job: Job, limit: int = 4000) -> str:
    try:
        with open(job.run_dir / LOG, "rb") as f:
            f.seek(job.log_offset)
            return f.read().decode(errors="replace")[-limit:]
    except OSError:
        return ""


def _worker_error(tail: str, rc: int) -> str:
    lines = [ln for ln in tail.splitlines() if ln.startswith("klppo worker: ")]
    return lines[-1].removeprefix("klppo worker: ") if lines else f"worker exited with code {rc}"


def outcomes(job: Job, rc: int) -> dict[Path, dict[str, Any]]:
    """:func:`outcome` of each run of the job (one, or a batched group's)."""
    return {d: outcome(job, rc, d) for d in job.run_dirs}


def outcome(job: Job, rc: int, run_dir: Path | None = None) -> dict[str, Any]:
    """How the job ended for ``run_dir`` (default: the job's run): ``{"state", "error",
    "wall_s"}`` (+ ``traceback`` when it failed).

    The run's own status.json decides when the worker wrote it in this launch; otherwise a job
    that was asked to stop is 'interrupted' and anything else 'failed' (a hard crash). Either
    way status.json is brought up to date, except when another process holds the run.
    """
    wall = time.time() - job.started
    run_dir = job.run_dir if run_dir is None else run_dir
    status = R.read_status(run_dir) or {}
    state = status.get("state") if status.get("time", 0) >= job.started else None
    if state in ("finished", "interrupted"):
        return {"state": state, "error": None, "wall_s": wall}
    tail = _log_tail(job)
    if state == "failed" and not _stopped_while_starting(job, status):
        return {"state": "failed", "error": status.get("error"),
                "traceback": status.get("traceback"), "wall_s": wall}
    if job.stop_level and rc != BUSY_EXIT:
        how = "killed by the sweep" if job.stop_level > 1 else f"stopped (exit code {rc})"
        R.write_status(run_dir, "interrupted", error=f"worker {how}; it resumes from its "
                       f"last checkpoint", iteration=status.get("iteration"))
        return {"state": "interrupted", "error": None, "wall_s": wall}
    err = _worker_error(tail, rc)
    if rc != BUSY_EXIT:
        R.write_status(run_dir, "failed", error=err, traceback=tail)
    return {"state": "failed", "error": err, "traceback": tail, "wall_s": wall}


def _stopped_while_starting(job: Job, status: dict[str, Any]) -> bool:
    """A run asked to stop that then failed to start (building its envs, importing their
    modules): the signal broke the start, so it is interrupted, not failed; its next launch
    starts it again and reports a real problem then."""
    return bool(job.stop_level) and str(status.get("error", "")).startswith("cannot start")


def _interruptible() -> None:
    """Undo an inherited 'ignore SIGINT' (a shell's background job passes it to the Ray workers
    it starts): ``ray.cancel`` stops a running task with SIGINT, which must reach it."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_one(run_dir: str | Path) -> dict[str, Any]:
    """Run (or resume, or skip) one sweep run in a fresh Python process; never raises.

    Returns :func:`outcome`'s dict. A KeyboardInterrupt while waiting (Ctrl-C, or
    ``ray.cancel`` of the task) asks the worker to checkpoint and stop; a second one kills it.
    This is what each Ray task runs.
    """
    status = R.read_status(Path(run_dir))
    if status and status.get("state") == "finished":
        return {"state": "finished", "error": None, "wall_s": None}
    _interruptible()
    job = start(run_dir)
    return outcome(job, _wait(job))


def run_group(run_dirs: list[str | Path]) -> dict[str, dict[str, Any]]:
    """:func:`run_one` for a batched group: its runs that are not finished in one worker;
    :func:`outcome` by run directory (what each Ray task of a batched sweep runs)."""
    todo = [Path(d) for d in run_dirs
            if (R.read_status(Path(d)) or {}).get("state") != "finished"]
    done = {str(d): {"state": "finished", "error": None, "wall_s": None}
            for d in map(Path, run_dirs) if d not in todo}
    if not todo:
        return done
    _interruptible()
    job = start_group(todo)
    rc = _wait(job)
    return {**done, **{str(d): res for d, res in outcomes(job, rc).items()}}


def _wait(job: Job) -> int:
    """Wait for the job; a KeyboardInterrupt meanwhile raises its stop level."""
    while True:
        try:  # short waits: ray.cancel raises KeyboardInterrupt only between bytecodes
            return job.proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:
            stop(job, job.stop_level + 1)
