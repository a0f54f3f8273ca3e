"""Atomic file writes: a temp file beside the target, fsync, rename over it.

A kill or a full disk at any moment leaves the previous file intact (or the new one, whole),
and a failed write removes its temp file. :func:`atomic_write_all` writes several files so,
their fsyncs side by side: a group of runs checkpoints every run at the same iteration, and the
filesystem's journal can commit several files in one flush where one after another each waits
for its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_all", "temp_name"]

#: the most fsyncs in flight at once (threads that wait on the disk, not on a core)
MAX_SYNCS = 16


def temp_name(path: Path) -> Path:
    """The temp file of an atomic write of ``path``: ``.NAME.tmpPID`` beside it."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; an :class:`OSError` names ``path`` (the file the
    user knows, not the temp file)."""
    error = atomic_write_all([(path, data)])[0]
    if error is not None:
        raise error


def atomic_write_all(files: Sequence[tuple[Path, bytes]]) -> list[OSError | None]:
    """Write each ``(path, data)`` atomically: every temp file written, their fsyncs side by
    side, then each renamed over its path in order. Per file ``None`` or the :class:`OSError`
    (naming its path) that left its previous file in place; a file's failure does not stop the
    others. An interruption (``KeyboardInterrupt``) removes the temp files not yet renamed."""
    errors: list[OSError | None] = [None] * len(files)
    temps = [temp_name(path) for path, _ in files]
    try:
        for k, (_, data) in enumerate(files):
            errors[k] = _attempt(_write, temps[k], data)
        todo = [k for k in range(len(files)) if errors[k] is None]
        for k, e in zip(todo, _sync_all([temps[k] for k in todo])):
            errors[k] = e
        for k, (path, _) in enumerate(files):
            if errors[k] is None:
                errors[k] = _attempt(os.replace, temps[k], path)
    finally:  # a renamed temp file is gone; any other is removed
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return [None if e is None else OSError(e.errno, e.strerror, str(path))
            for e, (path, _) in zip(errors, files)]


def _attempt(fn: Callable[..., object], *args: object) -> OSError | None:
    try:
        fn(*args)
    except OSError as e:
        return e
    return None


def _write(tmp: Path, data: bytes) -> None:
    with open(tmp, "wb") as f:
        f.write(data)


def _sync(tmp: Path) -> None:
    fd = os.open(tmp, os.O_RDWR)  # Windows flushes only a handle open for writing
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_all(temps: list[Path]) -> list[OSError | None]:
    """fsync each file; several at once in threads (no file stays open while it waits)."""
    if len(temps) <= 1:
        return [_attempt(_sync, t) for t in temps]
    with ThreadPoolExecutor(min(MAX_SYNCS, len(temps))) as pool:
        return list(pool.map(lambda t: _attempt(_sync, t), temps))
