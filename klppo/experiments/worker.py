"""``python -m klppo.experiments.worker RUN_DIR``: run or resume the run whose config is there
(a training run's ``config.yaml``, or an RLHF arm's ``pending.yaml``);
``python -m klppo.experiments.worker --batched RUN_DIR...``: run or resume those training runs
together in one engine group (:func:`klppo.rl.train_group`).

The worker never outlives the process that started it (the pid in ``KLPPO_PARENT_PID``, else
its parent at start): on Linux the kernel sends it SIGTERM when that parent dies
(``PR_SET_PDEATHSIG``); elsewhere a daemon thread polls the parent pid. A SIGTERM stops the run
the way a first Ctrl-C does: finish the iteration, checkpoint, status 'interrupted'.

Exit codes: 0 finished or interrupted (status.json says which), 1 failed, 75 the run directory
(or one of a batched group's) is held by another process, 130 interrupted before training
started. A batched group's runs each end in their own status.json (one may fail while the others
finish).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from klppo.experiments.launch import BUSY_EXIT, PARENT_ENV
from klppo.runs import rundir as R

PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` when our parent (the thread that forked us) exits."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _term_as_interrupt(signum, frame) -> None:
    # the trainer treats a first SIGINT as "checkpoint and stop"; outside training it raises
    # KeyboardInterrupt, which main() turns into a quiet exit
    signal.raise_signal(signal.SIGINT)


def _watch_parent(parent: int, poll_s: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)


def stop_with_parent() -> None:
    """Listen to SIGINT and SIGTERM, and SIGTERM this process when its parent dies (kernel
    signal, else a polling thread)."""
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    # a signal mask is inherited: Ray's workers block SIGINT, which would make us deaf to it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGTERM, _term_as_interrupt)
    if not _set_parent_death_signal(signal.SIGTERM):
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="klppo-parent-watch").start()
    if os.getppid() != parent:  # the parent died before we asked to be told
        os.kill(os.getpid(), signal.SIGTERM)


def _record(result) -> None:
    """Make status.json say how the run ended (resuming a complete run writes no status)."""
    if (R.read_status(result.run_dir) or {}).get("state") != result.status:
        last = result.metrics[-1].get("iteration") if result.metrics else 0
        R.write_status(result.run_dir, result.status, iteration=last)


def _run(run_dir: Path) -> None:
    """An RLHF comparison arm (``pending.yaml``) or a training run (``config.yaml``)."""
    from klppo.experiments.rlhf_worker import PENDING, run_arm

    if (run_dir / PENDING).exists():
        run_arm(run_dir)
        return
    from klppo.rl.trainer import resume

    _record(resume(run_dir))


def _run_batched(run_dirs: list[str | Path]) -> None:
    from klppo.rl.engine.rundirs import train_group

    for result in train_group(run_dirs):
        if result.status != "failed":  # a failed run's status.json holds its reason already
            _record(result)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:
        stop_with_parent()
        if argv[0] == "--batched":
            _run_batched([Path(a) for a in argv[1:]])
        else:
            _run(Path(argv[0]))
    except KeyboardInterrupt:
        print("klppo worker: interrupted", file=sys.stderr)
        return 130
    except R.DirBusyError as e:
        print(f"klppo worker: {e}", file=sys.stderr)
        return BUSY_EXIT
    except Exception as e:  # noqa: BLE001 - the status file holds the details
        print(f"klppo worker: {e!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
