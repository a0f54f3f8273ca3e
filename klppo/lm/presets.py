"""Named RLHF settings (``klppo rlhf --preset NAME``, ``klppo rlhf compare --preset NAME``).

The defaults of :class:`~klppo.lm.config.RLHFConfig` are the settings of the 1M-parameter Austen
model (``klppo lm pretrain``): lr 1e-4 and the proportional rule. On a pretrained LM those
settings do not hold a KL target: at lr 1e-4 the KL of SmolLM2-135M grew about 1 nat per
iteration whatever beta did (docs/algorithms.md, "Can beta hold the KL of a pretrained LM?").
A preset names settings that were measured to hold one; each is the config of one arm of a
committed study, checked field by field against it (``tests/lm/test_presets.py``).
"""

from __future__ import annotations

from typing import Any

from klppo.lm.config import RLHFConfig
from klppo.runs.errors import ConfigError

__all__ = ["RLHF_PRESETS", "rlhf_preset", "preset_values"]

#: Preset name -> (the fields it sets, the study it is an arm of).
RLHF_PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    # SmolLM2-135M-Instruct in full on a CPU: Adam 1e-5, 16 responses per iteration, the PID rule
    # with gains relative to the target (kp = 1/3, ki = 0.05 per nat), target 3 nats per sequence,
    # 64 iterations. The arm adaptive_from_weak of the study: second-half KL within 9% of the
    # target on each of 3 seeds, from this start beta and from 2.0.
    "smollm2": ({"model": "smollm2", "controller": "pid", "beta": 0.04, "target": 3.0,
                 "iterations": 64, "batch_size": 16, "lr": 1e-5, "checkpoint_every": 8},
                "docs/results/rlhf-smollm2-pid"),
}


def preset_values(name: str) -> dict[str, Any]:
    """The fields preset ``name`` sets (a copy); a one-line :class:`ConfigError` naming the
    value and the presets for a name that is none of them."""
    if name not in RLHF_PRESETS:
        raise ConfigError(f"preset={name!r}: no such RLHF preset; one of "
                          f"{', '.join(sorted(RLHF_PRESETS))}")
    return dict(RLHF_PRESETS[name][0])


def rlhf_preset(name: str) -> RLHFConfig:
    """The defaults with preset ``name``'s fields over them, validated."""
    from klppo.lm.config_checks import config_from_dict

    return config_from_dict(preset_values(name), what=f"preset {name!r}")
