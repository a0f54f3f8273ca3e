"""Atomic file writes: a temp file beside the target, fsync, rename over it.

A kill or a full disk at any moment leaves the previous file intact (or the new one, whole),
and a failed write removes its temp file. :func:`atomic_write_all` writes several runs' files
so, their fsyncs side by side: a group of runs checkpoints every run at the same iteration, and
the filesystem's journal can commit several files in one flush where one after another each
waits for its own.
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
    error = atomic_write_all([[(path, data)]])[0]
    if error is not None:
        raise error


Files = Sequence[tuple[Path, bytes]]


def atomic_write_all(sets: Sequence[Files]) -> list[OSError | None]:
    """Write sets of files (one set per run: its ``(path, data)`` pairs), each file
    atomically: every temp file written, their fsyncs side by side, then the files of each set
    whose every file was written and synced renamed over their paths, in order. Per set
    ``None`` or the first :class:`OSError` (naming its path); a set that failed before its
    renames keeps all its previous files, and one set's failure does not stop the others. An
    interruption (``KeyboardInterrupt``) removes the temp files not yet renamed."""
    flat = [(s, path, data) for s, files in enumerate(sets) for path, data in files]
    temps = [temp_name(path) for _, path, _ in flat]
    errors: list[OSError | None] = [None] * len(sets)

    def note(s: int, e: OSError | None, path: Path) -> None:
        if e is not None and errors[s] is None:
            errors[s] = OSError(e.errno, e.strerror, str(path))

    try:
        for (s, path, data), tmp in zip(flat, temps):
            note(s, _attempt(_write, tmp, data), path)
        todo = [k for k, (s, _, _) in enumerate(flat) if errors[s] is None]
        for k, e in zip(todo, _sync_all([temps[k] for k in todo])):
            note(flat[k][0], e, flat[k][1])
        for (s, path, _), tmp in zip(flat, temps):
            if errors[s] is None:
                note(s, _attempt(os.replace, tmp, path), path)
    finally:  # a renamed temp file is gone; any other is removed (as far as the disk lets)
        for tmp in temps:
            _attempt(tmp.unlink, True)
    return errors


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
    if len(temps) > 1:
        try:
            with ThreadPoolExecutor(min(MAX_SYNCS, len(temps))) as pool:
                return list(pool.map(lambda t: _attempt(_sync, t), temps))
        except RuntimeError:  # no thread to be had (a pid or thread limit): one after another
            pass
    return [_attempt(_sync, t) for t in temps]
