"""Gymnasium side: env factory, rollout, the training engine and its entry points."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: each public name and the module that defines it; imported on first use (PEP 562), so that
#: ``klppo train --help`` reads the config without importing torch and the engine
_WHERE = {
    "TrainConfig": "config", "validate": "config_checks",
    "train_batched": "engine.rundirs", "train_group": "engine.rundirs",
    "PRESETS": "presets", "preset": "presets",
    "ResumeError": "trainer", "TrainingError": "trainer", "TrainResult": "trainer",
    "final_return": "trainer", "resume": "trainer", "train": "trainer",
}

__all__ = ["PRESETS", "TrainConfig", "preset", "validate", "TrainResult", "TrainingError",
           "ResumeError", "final_return", "resume", "train", "train_group", "train_batched"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'klppo.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"klppo.rl.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:
    from klppo.rl.config import TrainConfig
    from klppo.rl.config_checks import validate
    from klppo.rl.engine.rundirs import train_batched, train_group
    from klppo.rl.presets import PRESETS, preset
    from klppo.rl.trainer import (
        ResumeError,
        TrainingError,
        TrainResult,
        final_return,
        resume,
        train,
    )
