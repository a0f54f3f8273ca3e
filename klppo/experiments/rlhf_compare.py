"""``klppo rlhf compare``: fixed vs adaptive KL control from the same start, in both regimes.

Four arms per seed: a fixed beta that is too strong and the adaptive controller started from it;
a fixed beta that is too weak and the adaptive controller started from it. Each arm is its own
worker process (one torch thread) of the experiments' pool, ``workers`` at a time, exactly like a
sweep's runs; budgets are in iterations.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

from klppo.core.controllers import ControllerName
from klppo.experiments.pool import SweepStop, run_local, signals_to
from klppo.experiments.rlhf_worker import PENDING
from klppo.lm.config import ConfigError, RLHFConfig
from klppo.lm.config_checks import validate_rlhf
from klppo.runs import rundir as R

__all__ = ["ARMS_PER_SEED", "arms", "run_compare"]


#: arms per seed: a fixed and an adaptive beta, each from the strong and from the weak beta
ARMS_PER_SEED = 4


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
                    # validate_rlhf refuses a controller name that is not a ControllerName
                    named = cast(ControllerName, ctrl)
                    out[name] = validate_rlhf(dataclasses.replace(base, controller=named,
                                                                  beta=beta, seed=seed))
                except ConfigError as e:
                    raise ConfigError(f"{e} (arm {name})") from None
    return out


def run_compare(configs: dict[str, RLHFConfig], out: str | Path, workers: int = 2,
                on_done=None, stop: SweepStop | None = None) -> dict[str, tuple[str, str | None]]:
    """Run every arm under ``out/runs/NAME`` in the experiments' process pool (idempotent:
    finished arms are skipped, interrupted ones continue exactly). Ctrl-C / SIGTERM stop it
    the way they stop a sweep."""
    out, stop = Path(out), stop or SweepStop()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    dirs: dict[str, str] = {}
    results: dict[str, tuple[str, str | None]] = {}
    for name, cfg in configs.items():
        d = out / "runs" / name
        d.mkdir(exist_ok=True)
        R.write_yaml(d / PENDING, dataclasses.asdict(dataclasses.replace(cfg, out=str(d))))
        if (R.read_status(d) or {}).get("state") == "finished":
            results[name] = ("finished", None)
            if on_done is not None:
                on_done(name, "finished", None)
        else:
            dirs[name] = str(d)

    def update(name: str, res: dict) -> None:
        if res["state"] in ("running", "pending"):
            return
        results[name] = (res["state"], res.get("error"))
        if on_done is not None:
            on_done(name, *results[name])

    with signals_to(stop):
        run_local(dirs, workers, update, stop)
    return results
