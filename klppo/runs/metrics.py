"""Metric sinks: JSONL (always), TensorBoard (when installed), Weights & Biases (opt-in)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

__all__ = ["Sink", "JsonlSink", "TensorBoardSink", "WandbSink", "require_wandb",
           "wandb_run_id", "MetricsWriter", "read_metrics", "read_numbered_metrics",
           "policies_of", "truncate_metrics", "rewrite_metrics", "NAMESPACES", "CLEANRL_NAMES",
           "dashboard_scalars"]

#: key prefix -> dashboard namespace (CleanRL style) for TensorBoard and W&B.
NAMESPACES: dict[str, str] = {
    "episode_": "charts", "lr": "charts", "loss": "losses", "value_": "losses",
    "explained_variance": "losses", "entropy": "policy", "kl": "kl", "beta": "kl",
    "ratio_": "policy", "clip_fraction": "policy", "frac_": "policy", "sps": "perf",
    "time_": "perf", "early_stop": "policy", "approx": "kl", "clip_eps": "kl",
    "actuator_": "kl", "update_fraction": "policy", "bapo_": "policy",
}


#: klppo metric -> CleanRL's name for the same quantity, logged next to klppo's own name so
#: dashboards built for CleanRL runs work unchanged (docs/metrics.md maps every name).
CLEANRL_NAMES: dict[str, str] = {
    "episode_return_mean": "charts/episodic_return",
    "episode_length_mean": "charts/episodic_length",
    "lr": "charts/learning_rate",
    "sps": "charts/SPS",
    "value_loss": "losses/value_loss",
    "loss_objective": "losses/policy_loss",
    "entropy": "losses/entropy",
    "kl_k3": "losses/approx_kl",
    "kl_k1": "losses/old_approx_kl",
    "clip_fraction": "losses/clipfrac",
    "explained_variance": "losses/explained_variance",
}


def dashboard_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """Every numeric metric under its klppo namespace, plus CleanRL's names where one exists."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or k == "global_step":
            continue
        out[namespaced(k)] = v
        policy, _, name = k.rpartition("/")  # a multi-agent run's policy/name
        if name in CLEANRL_NAMES:
            out[f"{policy}/{CLEANRL_NAMES[name]}" if policy else CLEANRL_NAMES[name]] = v
    return out


def namespaced(key: str) -> str:
    """``kl/beta`` for ``beta``; a multi-agent run's ``adversary/beta`` -> ``adversary/kl/beta``."""
    policy, _, name = key.rpartition("/")
    if policy:
        return f"{policy}/{namespaced(name)}"
    for prefix, ns in NAMESPACES.items():
        if key.startswith(prefix):
            return f"{ns}/{key}"
    return f"other/{key}"


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


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._w = SummaryWriter(str(log_dir))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in dashboard_scalars(metrics).items():
            self._w.add_scalar(k, v, step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


def require_wandb() -> None:
    """Fail early, naming the pip command, when ``--track wandb`` is asked without wandb."""
    try:
        import wandb  # noqa: F401
    except ImportError as e:
        raise ImportError(f"track='wandb' needs the wandb package: pip install 'klppo[wandb]' "
                          f"({e})") from None


def wandb_run_id(run_dir: Path) -> str:
    """A W&B run id that is stable for one run directory (so ``--resume`` continues the same
    W&B run) and distinct for two directories with the same name (sweeps reuse names)."""
    path = str(Path(run_dir).resolve())
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(path).name)
    return f"{safe[:100]}-{hashlib.sha1(path.encode()).hexdigest()[:10]}"


class WandbSink:
    """Logs every numeric metric under its namespace at ``step = global_step``. Offline mode
    (``WANDB_MODE=offline``) writes the run under ``run_dir/wandb``."""

    def __init__(self, run_dir: Path, name: str, config: dict[str, Any], project: str) -> None:
        require_wandb()
        import wandb

        self._run = wandb.init(project=project, name=name, config=config, dir=str(run_dir),
                               resume="allow", id=wandb_run_id(run_dir))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self._run.log(dashboard_scalars(metrics), step=step)

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
