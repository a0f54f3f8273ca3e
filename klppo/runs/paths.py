"""Output paths checked before any work starts (nothing is created here)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_writable"]


def check_writable(path: str | Path, what: str = "out") -> None:
    """Fail early, one line naming ``what`` and the path, if ``path`` cannot be created or written:
    an existing file, a file among its ancestors, or a read-only nearest existing ancestor."""
    p = Path(path)
    name = f"{what}={str(p)!r}"
    if p.exists() and not p.is_dir():
        raise NotADirectoryError(f"{name}: exists and is not a directory")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise NotADirectoryError(f"{name}: {str(probe)!r} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(f"{name}: {str(probe)!r} is not writable")
