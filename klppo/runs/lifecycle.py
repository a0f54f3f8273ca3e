"""One run lifecycle for every trainer (single-agent, multi-agent, RLHF).

A trainer provides its iterations and its state (:class:`Trainer`); this module runs them in a
locked run directory: status.json (running, finished, interrupted, failed with the reason and
the checkpoint kept), clean stops on SIGINT/SIGTERM, the checkpoint cadence, metrics written
before anything else sees them, and the checks of a run directory at a resume.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.errors import ResumeError
from klppo.runs.signals import StopRequest
from klppo.runs.typecheck import short_repr

log = logging.getLogger(__name__)

__all__ = ["Trainer", "RunLife", "fail", "record", "checkpoint_due", "check_metrics",
           "check_run_dir", "metrics_records", "OnIteration", "StopRun"]

OnIteration = Callable[[dict[str, Any]], None] | None

#: the states the lifecycle itself gives a run
LIFECYCLE_STATES = ("running", "finished", "interrupted", "failed")


class StopRun(Exception):  # noqa: N818 - a request, not an error
    """Raised by an ``on_iteration`` callback to end the run after this iteration as
    ``state`` (e.g. ``'pruned'`` by a tuner), with ``reason`` in status.json. The iteration's
    metrics are kept and a checkpoint is written, so ``--resume`` can still continue the run;
    at the last iteration the run is simply 'finished'."""

    def __init__(self, state: str, reason: str) -> None:
        if state in LIFECYCLE_STATES or not state.isidentifier():
            raise ValueError(f"StopRun: state={state!r} must be a word other than "
                             f"{', '.join(LIFECYCLE_STATES)}")
        super().__init__(reason)
        self.state, self.reason = state, reason


class Trainer(Protocol):
    """What a trainer gives the lifecycle: its counters, one iteration at a time, its checkpoint
    and its resources."""

    iteration: int

    @property
    def num_iterations(self) -> int: ...

    @property
    def checkpoint_every(self) -> int: ...

    def iterate(self) -> dict[str, Any]:
        """Run iteration ``iteration + 1``, count it, and return its metrics."""

    def describe(self, metrics: dict[str, Any]) -> str:
        """A short summary of one iteration's metrics, for the log."""

    def check(self, metrics: dict[str, Any]) -> list[str]:
        """Warnings about one iteration's metrics (divergence), for the log and the status."""

    def checkpoint(self, run_dir: Path) -> list[tuple[Path, bytes]]:
        """The checkpoint of the iterations done, as files for the loop to write atomically
        (beside the other runs' of a group); what must be on disk before them (an LM's policy
        export) is written here."""

    def close(self) -> None:
        """Release what the trainer holds (environments)."""


class RunLife:
    """One process's life of a run directory: its lock, status and warnings, the iteration
    of the last checkpoint on disk (``saved``: 0 when there is none), and the signal that
    stopped it (``stop_signal``: None while none did)."""

    def __init__(self, run_dir: Path, lock: R.DirLock, saved: int = 0) -> None:
        self.run_dir, self.lock, self.saved = run_dir, lock, saved
        self.warnings: list[str] = []
        self.stop_signal: int | None = None
        #: the error that failed the run (:func:`fail`), None while none did
        self.failure: BaseException | None = None

    def status(self, state: str, iteration: int, **fields: Any) -> None:
        if self.warnings:
            fields["warnings"] = self.warnings
        R.write_status(self.run_dir, state, iteration=iteration,
                       checkpoint_iteration=self.saved, **fields)

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

    def kept(self) -> str:
        """What a failed run keeps, in words."""
        if self.saved:
            return f"the last good checkpoint (iteration {self.saved}) is kept"
        return "no checkpoint was written yet (a resume starts the run again)"


def fail(life: RunLife, iteration: int, it: int, error: BaseException) -> str:
    """Status 'failed' for a run that stopped on ``error`` during iteration ``it`` (with the
    traceback and what is kept); return the one-line reason."""
    life.failure = error
    what = " ".join(str(error).split())
    if not what.startswith("iteration"):
        what = f"iteration {it}: {type(error).__name__}: {what}"
    msg = f"{what}; {life.kept()}"
    life.final_status("failed", iteration, error=msg,
                      traceback="".join(traceback.format_exception(error)))
    return msg


def record(tr: Trainer, life: RunLife, writer: M.MetricsWriter, m: dict[str, Any],
           on_iteration: OnIteration) -> None:
    """After an iteration: log its metrics ``m``, call back (the checkpoint follows,
    :func:`checkpoint_due`)."""
    writer.write(m)
    for w in tr.check(m):
        life.warn(w)
    log.info("iteration %d/%d %s", tr.iteration, tr.num_iterations, tr.describe(m))
    if on_iteration is not None:
        on_iteration(m)


def checkpoint_due(tr: Trainer, stop: StopRequest) -> bool:
    """A checkpoint after this iteration: the last, one at the cadence, or a stop requested."""
    return (tr.iteration == tr.num_iterations or tr.iteration % tr.checkpoint_every == 0
            or stop.requested)


# ------------------------------------------------------------------------------ resume checks
def check_run_dir(run_dir: Path, command: str, what: str = "resume") -> None:
    """One-line :class:`ResumeError` for a path that is not a run directory (named as
    ``what``: ``resume`` for a resume, ``run_dir`` for a run being read)."""
    name = f"{what}={str(run_dir)!r}"
    if not run_dir.exists():
        raise ResumeError(f"{name}: no such directory")
    if not run_dir.is_dir():
        raise ResumeError(f"{name}: not a directory")
    if not (run_dir / "config.yaml").is_file():
        why = (f"{command} --resume continues a run it started" if what == "resume"
               else f"made by {command}")
        raise ResumeError(f"{name}: not a klppo run directory (no config.yaml); {why}")


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b": value}``; lists and tuples alike (YAML has no tuples)."""
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict)
                   else {f"{prefix}{k}": _plain(v)})
    return out


def _plain(v: Any) -> Any:
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def check_config_unchanged(run_dir: Path, now: dict[str, Any], saved: Any,
                           defaults: dict[str, Any], may_change: frozenset[str],
                           hint: Callable[[str], str] | None = None) -> None:
    """A resume continues the same run: ``config.yaml`` (``now``, as a mapping) must equal the
    checkpoint's own copy (``saved``) but for the fields (top-level names) in ``may_change``.
    A field newer than the checkpoint compares against its default (``defaults``). One-line
    :class:`ResumeError` naming the file, the field and both values; ``hint(field)`` says what
    to do (default: undo the edit)."""
    if not isinstance(saved, dict):
        raise ResumeError(f"{run_dir / 'checkpoint.pt'}: its config is {short_repr(saved)}, not a "
                          f"mapping; the checkpoint is not one klppo wrote")
    old, new, default = _flatten(saved), _flatten(now), _flatten(defaults)
    for key in sorted(set(old) | set(new)):
        before = old.get(key, default.get(key))
        if key.split(".")[0] in may_change or before == new.get(key):
            continue
        what = hint(key) if hint else "undo the edit or start a new run"
        raise ResumeError(f"{run_dir / 'config.yaml'}: {key}={short_repr(new.get(key))} but the "
                          f"checkpoint was made with {short_repr(before)}; a resume continues "
                          f"the same run ({what})")


def metrics_records(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``, each a JSON object with a whole iteration count; a
    torn last line (a kill mid-write) is dropped. ResumeError naming the line otherwise."""
    if not path.exists():
        return []
    numbered, _ = M.read_numbered_metrics(path)
    lines = [n for n, text in enumerate(path.read_bytes().splitlines(), 1) if text.strip()]
    good = {n for n, _ in numbered}
    damaged = [n for n in lines[:-1] if n not in good]
    if damaged:
        raise ResumeError(f"{path}: line {damaged[0]} is not a metrics record (not a JSON "
                          f"object); the file was edited or damaged (restore it, or delete "
                          f"the run directory to start again)")
    for n, r in numbered:
        it = r.get("iteration")
        if not isinstance(it, int) or isinstance(it, bool) or it < 1:
            raise ResumeError(f"{path}: line {n} has iteration={short_repr(it)}, not an "
                              f"iteration count; the file was edited or damaged (restore it, "
                              f"or delete the run directory to start again)")
    return [r for _, r in numbered]


def check_metrics(run_dir: Path, iteration: int) -> list[dict[str, Any]]:
    """The metrics kept up to the checkpoint's iteration; ResumeError when some are missing."""
    path = run_dir / "metrics.jsonl"
    kept = [r for r in metrics_records(path) if r["iteration"] <= iteration]
    # 1, 2, ..., iteration (compared record by record: a damaged checkpoint's huge iteration
    # allocates nothing)
    if len(kept) != iteration or any(r["iteration"] != n for n, r in enumerate(kept, 1)):
        have = "is missing" if not path.exists() else f"holds {len(kept)} of them"
        raise ResumeError(f"{path}: the checkpoint is at iteration {iteration} but the file "
                          f"{have}; the run cannot be resumed exactly (restore the file, or "
                          f"delete checkpoint.pt to restart the run)")
    return kept
