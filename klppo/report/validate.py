"""What makes a run directory unusable for ``klppo report``: each check raises :class:`Skip`
with the reason (naming the file, the line and the field), so the run is listed as skipped."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from klppo.runs.configfile import parse_yaml, read_text
from klppo.runs.errors import InputError
from klppo.runs.metrics import read_numbered_metrics

__all__ = ["Skip", "NUMERIC", "read_config", "read_records"]


class Skip(Exception):
    """A path the report cannot use; the message says why."""


#: metrics the report reads: each must be a finite number (or null) in every record
NUMERIC = ("global_step", "episode_return_mean", "episode_count", "kl_observed", "kl_rollout",
           "kl_target", "beta", "frac_in", "frac_pass", "frac_kill", "beta_t_q50", "beta_t_q90",
           "beta_t_q99")

#: a run directory of another klppo command, and the command that reports on it
_OTHER_KINDS = {"rlhf": "an RLHF run (config.yaml kind: rlhf); `klppo report` reads "
                        "`klppo train` runs, RLHF runs are reported by `klppo rlhf compare`"}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _yaml_mapping(path: Path) -> dict[str, Any]:
    try:  # the loader of every config klppo reads: YAML 1.2, no duplicate keys, bounded
        config = parse_yaml(read_text(path, "config"), "config.yaml")
    except InputError as e:
        why = str(e).replace(f"config={str(path)!r}: ", "config.yaml: ")
        raise Skip(why.replace("config.yaml: not ", "config.yaml is not ")) from None
    if config is None:
        raise Skip("config.yaml is empty")
    if not isinstance(config, dict):
        raise Skip(f"config.yaml holds a {type(config).__name__}, not a mapping")
    return config


def read_config(path: Path) -> dict[str, Any]:
    """A ``klppo train`` run's config.yaml, with the fields the report reads checked."""
    config = _yaml_mapping(path)
    if config.get("kind") in _OTHER_KINDS:
        raise Skip(_OTHER_KINDS[config["kind"]])
    for key, required in (("env", True), ("objective", False)):
        v = config.get(key)
        if (required or v is not None) and (not isinstance(v, str) or not v):
            raise Skip(f"config.yaml: {key}={v!r} is not a name (not a `klppo train` run?)")
    seed = config.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise Skip(f"config.yaml: seed={seed!r} is not an integer")
    for key in ("ppo", "kl", "marl"):
        if not isinstance(config.get(key) or {}, dict):
            raise Skip(f"config.yaml: {key}={config[key]!r} is not a mapping")
    overrides = (config.get("marl") or {}).get("overrides")
    if overrides is not None and not isinstance(overrides, list):
        raise Skip(f"config.yaml: marl.overrides={overrides!r} is not a list")
    return config


def _field_problem(key: str, v: Any) -> str | None:
    """Why the value ``v`` of the metric ``key`` is unusable (None: it is fine)."""
    name = key.rpartition("/")[2]
    if v is None and name != "global_step":
        return None
    if not _number(v):
        return "is not a number"
    if not math.isfinite(v):
        return "is not a finite number"
    if name in ("global_step", "episode_count") and (v < 0 or v != int(v)):
        return "is not a whole number >= 0"
    return None


def _check_record(record: dict[str, Any], previous: dict[str, Any] | None) -> str | None:
    for k, v in record.items():
        if k in NUMERIC or ("/" in k and k.rpartition("/")[2] in NUMERIC):
            why = _field_problem(k, v)
            if why:
                return f"{k}={v!r} {why}"
    if "global_step" not in record:
        return "no global_step"
    it = record.get("iteration")
    if it is not None and (not isinstance(it, int) or isinstance(it, bool) or it < 0):
        return f"iteration={it!r} is not a whole number >= 0"
    if previous is None:
        return None
    for k in ("iteration", "global_step"):
        now, before = record.get(k), previous.get(k)
        if now is not None and _number(before) and now <= before:
            return (f"{k}={now!r} after {before!r}: must increase line by line (a duplicated "
                    "or edited line?)")
    return None


def read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """A metrics.jsonl's records and its number of torn lines (a killed write leaves one:
    left out); a complete record with a field the report cannot use skips the run, naming
    the line and the field."""
    numbered, bad = read_numbered_metrics(path)
    previous = None
    for number, record in numbered:
        why = _check_record(record, previous)
        if why:
            raise Skip(f"metrics.jsonl line {number}: {why}")
        previous = record
    if not numbered:
        raise Skip("metrics.jsonl holds no complete record")
    return [r for _, r in numbered], bad
