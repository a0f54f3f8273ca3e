"""``klppo rlhf compare``: fixed vs adaptive KL control from the same start, in both regimes.

Four arms per seed: a fixed beta that is too strong and the adaptive controller started from it;
a fixed beta that is too weak and the adaptive controller started from it. Each arm is its own
process (one torch thread), ``workers`` at a time; budgets are in iterations.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from klppo.lm.config import ConfigError, RLHFConfig, validate_rlhf
from klppo.runs import rundir as R

__all__ = ["arms", "run_compare"]


def arms(base: RLHFConfig, strong_beta: float, weak_beta: float, adaptive: str,
         seeds: list[int]) -> dict[str, RLHFConfig]:
    """Name -> config of every arm (``fixed_strong``, ``adaptive_from_strong``, ...)."""
    out = {}
    for seed in seeds:
        for regime, beta in (("strong", strong_beta), ("weak", weak_beta)):
            for kind, ctrl in (("fixed", "fixed"), ("adaptive", adaptive)):
                name = f"{kind}_{regime}__{seed}" if kind == "fixed" else \
                    f"adaptive_from_{regime}__{seed}"
                try:
                    out[name] = validate_rlhf(dataclasses.replace(base, controller=ctrl,
                                                                  beta=beta, seed=seed))
                except ConfigError as e:
                    raise ConfigError(f"{e} (arm {name})") from None
    return out


def _run_arm(run_dir: Path) -> tuple[str, str | None]:
    st = R.read_status(run_dir)
    if st and st.get("state") == "finished":
        return "finished", None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "klppo.lm.worker", str(run_dir)],
                          capture_output=True, text=True, env=env)
    st = R.read_status(run_dir) or {}
    if proc.returncode == 0 and st.get("state") == "finished":
        return "finished", None
    err = st.get("error") or f"worker exited with code {proc.returncode}: {proc.stderr[-2000:]}"
    R.write_status(run_dir, "failed", error=err)
    return "failed", err


def run_compare(configs: dict[str, RLHFConfig], out: str | Path, workers: int = 2,
                on_done=None) -> dict[str, tuple[str, str | None]]:
    """Run every arm under ``out/runs/NAME`` (idempotent: finished arms are skipped)."""
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    dirs = {}
    for name, cfg in configs.items():
        d = out / "runs" / name
        d.mkdir(exist_ok=True)
        R.write_yaml(d / "pending.yaml", dataclasses.asdict(dataclasses.replace(cfg,
                                                                               out=str(d))))
        dirs[name] = d
    results = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futs = {pool.submit(_run_arm, d): name for name, d in dirs.items()}
        for f in as_completed(futs):
            results[futs[f]] = f.result()
            if on_done is not None:
                on_done(futs[f], *results[futs[f]])
    return results
