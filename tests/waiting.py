"""Helpers for tests that interrupt a training process mid-run."""

import time
from pathlib import Path


def wait_for_lines(path: Path, n: int, timeout: float = 120.0) -> None:
    """Return once ``path`` holds at least ``n`` lines (a run has written n iterations), or
    after ``timeout`` seconds; the caller's assertions then say what happened."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.02)
