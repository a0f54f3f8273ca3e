"""Metric sinks: JSONL (always), TensorBoard (when installed), Weights & Biases (opt-in).

The dashboards (TensorBoard, W&B) get each quantity once under the name of
:mod:`klppo.runs.names`, and the run's config as hyperparameters (TensorBoard's HPARAMS tab and
a ``hyperparameters`` text table; W&B's run config).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from klppo.runs.install import install_hint
from klppo.runs.names import MetricNames, dashboard_name, dashboard_scalars

log = logging.getLogger(__name__)

__all__ = ["Sink", "JsonlSink", "TensorBoardSink", "WandbSink", "WandbSettings",
           "require_wandb", "wandb_run_id", "hyperparameters", "MetricsWriter", "read_metrics",
           "read_numbered_metrics", "policies_of", "truncate_metrics", "rewrite_metrics",
           "dashboard_scalars"]

class Sink(Protocol):
    def write(self, step: int, metrics: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class JsonlSink:
    """One JSON object per line, written to the file at once (a killed run loses nothing); a
    write that fails (a full disk) is cut back to the last whole line before it raises."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                           0o644)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        data = (json.dumps({k: _json_safe(v) for k, v in metrics.items()}) + "\n").encode()
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            os.ftruncate(self._fd, end)
            raise OSError(e.errno, e.strerror, str(self.path)) from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def hyperparameters(config: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """A nested config as flat ``section.field: value`` pairs of the types TensorBoard's
    hparams take (a list or None as its text)."""
    out: dict[str, bool | int | float | str] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in hyperparameters(v).items()})
        elif isinstance(v, (bool, int, float, str)):
            out[k] = v
        else:
            out[k] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


class TensorBoardSink:
    """Every numeric metric once, under its dashboard name (``names``: klppo's, or CleanRL's
    or SB3's where they have one), at ``step = global_step``; the config, when given, as
    hyperparameters (the HPARAMS tab, with the return as its metric) and as a text table."""

    def __init__(self, log_dir: Path, config: dict[str, Any] | None = None,
                 names: MetricNames = "klppo") -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._w = SummaryWriter(str(log_dir))
        self.names = names
        if config is not None:
            self._hparams(hyperparameters(config))

    def _hparams(self, hp: dict[str, bool | int | float | str]) -> None:
        from torch.utils.tensorboard.summary import hparams

        ret = dashboard_name("episode_return_mean", self.names)[0]
        for summary in hparams(hp, {ret: 0.0}):  # the metric's values are its scalars
            self._w._get_file_writer().add_summary(summary)
        rows = "\n".join(f"|{k}|{v}|" for k, v in hp.items())
        self._w.add_text("hyperparameters", f"|param|value|\n|-|-|\n{rows}")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in dashboard_scalars(metrics, self.names).items():
            self._w.add_scalar(k, v, step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


def require_wandb() -> None:
    """Fail early, naming the pip command, when ``--track wandb`` is asked without wandb."""
    try:
        import wandb  # noqa: F401
    except ImportError as e:
        raise ImportError(f"track='wandb' needs the wandb package: {install_hint('wandb')} "
                          f"({e})") from None


def wandb_run_id(run_dir: Path) -> str:
    """A W&B run id that is stable for one run directory (so ``--resume`` continues the same
    W&B run) and distinct for two directories with the same name (sweeps reuse names)."""
    path = str(Path(run_dir).resolve())
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(path).name)
    return f"{safe[:100]}-{hashlib.sha1(path.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class WandbSettings:
    """Where a W&B run goes: its project, entity (team or user; None: the default of the
    logged-in account), group (sweeps group their runs by the sweep's name) and tags."""

    project: str = "klppo"
    entity: str | None = None
    group: str | None = None
    tags: tuple[str, ...] = ()


class WandbSink:
    """Logs every numeric metric once under its dashboard name at ``step = global_step``, with
    the run's config as the W&B config. Offline mode (``WANDB_MODE=offline``) writes the run
    under ``run_dir/wandb``. Each sink owns its W&B run, so the runs of one engine group log
    side by side from one process."""

    def __init__(self, run_dir: Path, name: str, config: dict[str, Any],
                 settings: WandbSettings = WandbSettings(),
                 names: MetricNames = "klppo") -> None:
        require_wandb()
        import wandb

        self.names = names
        self._run = wandb.init(project=settings.project, entity=settings.entity,
                               group=settings.group, tags=list(settings.tags) or None,
                               name=name, config=config, dir=str(run_dir), resume="allow",
                               id=wandb_run_id(run_dir),
                               # runs of one engine group log side by side from one process
                               reinit="create_new")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self._run.log(dashboard_scalars(metrics, self.names), step=step)

    def close(self) -> None:
        self._run.finish()


class MetricsWriter:
    """Fan one metrics dict per iteration out to every sink."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def write(self, metrics: dict[str, Any]) -> None:
        step = int(metrics.get("global_step", 0))
        for s in self.sinks:
            s.write(step, metrics)

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception:  # a sink failing to close must not lose the others
                log.exception("closing metrics sink %r failed", s)


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Parse a metrics.jsonl; return (records, number of unparseable lines skipped).

    A run killed mid-write leaves a truncated last line: it is skipped, not fatal; so is a line
    that is not UTF-8 text or not a JSON object.
    """
    numbered, bad = read_numbered_metrics(path)
    return [r for _, r in numbered], bad


def read_numbered_metrics(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """:func:`read_metrics` with each record's line number (from 1), to name it in errors."""
    records, bad = [], 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, nesting
                record = None
            if isinstance(record, dict):
                records.append((number, record))
            else:
                bad += 1
    return records, bad


def policies_of(records: list[dict[str, Any]]) -> list[str]:
    """The policies of a multi-agent run's metrics records (each logs ``POLICY/kl_rollout``), in
    the order they are logged; [] for a single-agent run."""
    names: dict[str, None] = {}
    for r in records:
        for k in r:
            if k.endswith("/kl_rollout"):
                names.setdefault(k[:-len("/kl_rollout")], None)
    return list(names)


def truncate_metrics(path: Path, keep_iterations: int) -> None:
    """Keep the first ``keep_iterations`` complete records (used when resuming)."""
    if not path.exists():
        return
    records, _ = read_metrics(path)
    rewrite_metrics(path, [r for r in records if isinstance(r.get("iteration"), int)
                           and r["iteration"] <= keep_iterations])


def rewrite_metrics(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace ``path`` by ``records`` (temp file, then rename; used when resuming)."""
    if not path.exists() and not records:
        return
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    tmp.replace(path)
