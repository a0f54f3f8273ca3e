"""Which runs of a sweep share a process under ``--engine batched``.

Runs the batched engine serves (:func:`klppo.rl.batched.refusal`) and that have one shape
(:func:`klppo.rl.batched.group_key`: env, rollout and minibatch sizes, epochs, network) form a
group, split into groups of at most ``group_size``; each group is one worker process
(:func:`klppo.rl.batched.train_group`). A condition the engine cannot serve trains in the ordinary
engine, one process per run, and the sweep says so in one line. Runs on the numpy fast path
and runs on torch (``fast_path: false``, on the CPU or a GPU) form separate groups; a device that
does not resolve here (cuda without a GPU) is refused before anything starts.
"""

from __future__ import annotations

from typing import Literal

from klppo.experiments.sweep_spec import RunPlan
from klppo.rl import config as C

__all__ = ["Engine", "ENGINES", "plan_groups"]

Engine = Literal["process", "batched"]
ENGINES = ("process", "batched")


def plan_groups(plans: list[RunPlan], engine: str, group_size: int | None = None
                ) -> tuple[list[list[str]], list[str]]:
    """The batched groups (run names, in ``plans``' order) and one note per condition that
    trains in the ordinary engine instead; ``([], [])`` for the process engine. ConfigError
    (one line, nothing started) for a bad ``engine`` / ``group_size`` or a device that does not
    resolve here (cuda without a GPU)."""
    if engine not in ENGINES:
        raise C.ConfigError(f"engine={engine!r}: must be one of {list(ENGINES)}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size < 1):
        raise C.ConfigError(f"group_size={group_size!r}: must be an integer >= 1")
    if engine == "process":
        return [], []
    from klppo.rl.batched import device_refusal, group_key, refusal

    keyed: dict[tuple, list[str]] = {}
    refused: dict[str, str] = {}
    for plan in plans:
        why = refusal(plan.config)
        if why is not None:  # e.g. a multi-agent env: the ordinary engine's to train
            refused.setdefault(plan.condition, why)
            continue
        why = device_refusal(plan.config)
        if why is not None:
            raise C.ConfigError(f"condition {plan.condition}: {why}")
        keyed.setdefault(group_key(plan.config), []).append(plan.name)
    size = group_size or max(len(g) for g in keyed.values()) if keyed else 1
    groups = [names[i:i + size] for names in keyed.values() for i in range(0, len(names), size)]
    notes = [f"condition {c} trains in the ordinary engine, one process per run: the batched "
             f"engine cannot serve {why}" for c, why in refused.items()]
    return groups, notes
