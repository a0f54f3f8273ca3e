"""One process's life of a run directory: reading it back, its lock, status and warnings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from klppo.rl.config import ConfigError, TrainConfig, from_dict, validate
from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.errors import ResumeError

log = logging.getLogger("klppo.rl.trainer")

__all__ = ["RunLife", "ResumeError", "read_run_config", "check_metrics", "check_resume",
           "RESUMABLE_CHANGES"]

#: config fields that may differ between a run's checkpoint and its ``config.yaml`` at a resume:
#: where files go, what is logged, how often to checkpoint, and where it computes (the device and
#: torch's threads may change the rounding, as another machine would; the resume is recorded).
RESUMABLE_CHANGES = frozenset({"out", "runs_root", "tensorboard", "track", "checkpoint_every",
                               "device", "torch_threads"})


class RunLife:
    """One process's life of a run directory: its lock, status, warnings and metric sinks."""

    def __init__(self, run_dir: Path, lock: R.DirLock, warnings: list[str]) -> None:
        self.run_dir, self.lock, self.warnings = run_dir, lock, list(warnings)

    def status(self, state: str, iteration: int, **fields: Any) -> None:
        if self.warnings:
            fields["warnings"] = self.warnings
        R.write_status(self.run_dir, state, iteration=iteration, **fields)

    def final_status(self, state: str, iteration: int, **fields: Any) -> None:
        """The status of a run that is ending on an error: best effort (the error may be the
        full disk that this write needs too)."""
        try:
            self.status(state, iteration, **fields)
        except OSError as e:
            log.error("cannot write status.json (%s); the run ended %s: %s", e, state,
                      fields.get("error"))

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)


def read_run_config(run_dir: str | Path) -> TrainConfig:
    """The validated config of a run directory; one-line errors for a missing directory, a
    missing or malformed ``config.yaml`` or bad values in it."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ResumeError(f"resume={str(run_dir)!r}: no such directory")
    if not run_dir.is_dir():
        raise ResumeError(f"resume={str(run_dir)!r}: not a directory")
    if not (run_dir / "config.yaml").exists():
        raise ResumeError(f"resume={str(run_dir)!r}: not a klppo run directory (no config.yaml)")
    path = run_dir / "config.yaml"
    cfg = from_dict(R.read_yaml(path), source=str(path))
    try:
        return validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _iterations(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``, each with a whole iteration count (ResumeError naming
    the record otherwise)."""
    records = M.read_metrics(path)[0] if path.exists() else []
    for n, r in enumerate(records, 1):
        it = r.get("iteration")
        if not isinstance(it, int) or isinstance(it, bool) or it < 1:
            raise ResumeError(f"{path}: record {n} has iteration={_short(it)}, not an iteration "
                              f"count; the file was edited or damaged (restore it, or delete "
                              f"the run directory to start again)")
    return records


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_metrics(run_dir: Path, iteration: int) -> list[dict[str, Any]]:
    """The metrics kept up to the checkpoint's iteration; an error when some are missing."""
    path = run_dir / "metrics.jsonl"
    kept = [r for r in _iterations(path) if r["iteration"] <= iteration]
    if [r["iteration"] for r in kept] != list(range(1, iteration + 1)):
        have = "is missing" if not path.exists() else f"holds {len(kept)} of them"
        raise ResumeError(f"{path}: the checkpoint is at iteration {iteration} but the file "
                          f"{have}; the run cannot be resumed exactly (restore the file, or "
                          f"delete checkpoint.pt to restart the run)")
    return kept


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _check_config(run_dir: Path, cfg: TrainConfig, saved: Any) -> None:
    """The checkpoint's config (written since klppo stored it there) must equal ``config.yaml``
    but for :data:`RESUMABLE_CHANGES`."""
    from klppo.rl.config import to_dict

    path = run_dir / "config.yaml"
    if not isinstance(saved, dict):
        raise ResumeError(f"{run_dir / 'checkpoint.pt'}: its config is {_short(saved)}, not a "
                          f"mapping; the checkpoint is not one klppo wrote")
    old, new = _flatten(saved), _flatten(to_dict(cfg))
    for key in sorted(set(old) | set(new)):
        if key.split(".")[0] in RESUMABLE_CHANGES or old.get(key) == new.get(key):
            continue
        raise ResumeError(f"{path}: {key}={_short(new.get(key))} but the checkpoint was made "
                          f"with {_short(old.get(key))}; a resume continues the same run (undo "
                          f"the edit or start a new run; docs/reliability.md says what may change)")


def _check_metadata(run_dir: Path) -> None:
    import json

    path = run_dir / "metadata.json"
    if not path.exists():
        return
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResumeError(f"{path}: unreadable ({type(e).__name__}); restore it, or delete it "
                          f"(the run's provenance is then lost)") from None
    if not isinstance(meta, dict):
        raise ResumeError(f"{path}: holds {type(meta).__name__} {_short(meta)}, not a mapping")
    if not isinstance(meta.get("resumes", []), list):
        raise ResumeError(f"{path}: resumes={_short(meta['resumes'])}, not a list")
    if meta.get("kind", "train") != "train":
        raise ResumeError(f"{path}: kind={_short(meta['kind'])}: not a training run "
                          f"(klppo train --resume continues runs of klppo train)")


def check_resume(run_dir: Path, cfg: TrainConfig,
                 state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Check that a run directory's files belong together before a resume touches any of them;
    return the metrics kept (up to the checkpoint). One-line :class:`ResumeError` otherwise."""
    _check_metadata(run_dir)
    if state is None:
        done = [r["iteration"] for r in _iterations(run_dir / "metrics.jsonl")]
        if done and max(done) >= cfg.checkpoint_every:
            raise ResumeError(f"{run_dir / 'checkpoint.pt'}: missing, but metrics.jsonl holds "
                              f"iteration {max(done)} (a checkpoint is written every "
                              f"{cfg.checkpoint_every}); restore checkpoint.pt, or delete "
                              f"metrics.jsonl to restart the run from scratch")
        return []
    iteration, step = state["iteration"], state.get("global_step")
    if "config" in state:
        _check_config(run_dir, cfg, state["config"])
    if step != iteration * cfg.batch_size or iteration > cfg.num_iterations:
        raise ResumeError(f"{run_dir / 'checkpoint.pt'}: iteration {iteration} at global step "
                          f"{_short(step)} does not fit this run's config (batch "
                          f"{cfg.batch_size}, {cfg.num_iterations} iterations): a checkpoint "
                          f"of another run?")
    return check_metrics(run_dir, iteration)
