"""Shared by the benchmarks: run Python code in a fresh one-thread process and time it."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def run(code: str, pythonpath: str | None = None) -> tuple[float, list[str]]:
    """Wall time (imports included) and the fields after ``RESULT`` on the last such line;
    ``pythonpath`` puts another source tree's ``klppo`` first on the path."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=pythonpath or None)
    wall = time.perf_counter() - t
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return wall, line.split()[1:]
