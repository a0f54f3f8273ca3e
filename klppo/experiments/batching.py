"""Which runs of a sweep share a worker process.

Every run trains in klppo's one engine (:mod:`klppo.rl.engine`), whose unit is a group of runs.
The runs of a sweep that can share a group
(:func:`klppo.rl.engine.group_key`: the spaces their envs make, network, step library and device,
batch and minibatch sizes, epochs, rollout length, env backend, torch threads) are spread over
the sweep's workers: each shape's runs in ``min(workers, runs)`` groups of nearly equal size
(at most ``group_size`` runs each when it is given), in the sweep's seed-by-seed order; each
group is one worker process (:func:`klppo.rl.train_group`). ``group_size=1`` trains each run in
a process of its own (a group of one). A device that does not resolve here (cuda without a GPU)
is refused before anything starts.
"""

from __future__ import annotations

from klppo.experiments.sweep_spec import RunPlan
from klppo.rl import config as C
from klppo.rl.engine.groups import device_refusal, group_key

__all__ = ["plan_groups"]


def _check(group_size: int | None, workers: int | None) -> None:
    for name, value in (("group_size", group_size), ("workers", workers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise C.ConfigError(f"{name}={value!r}: must be an integer >= 1")


def plan_groups(plans: list[RunPlan], group_size: int | None = None,
                workers: int | None = None) -> tuple[list[list[str]], list[str]]:
    """The groups (run names, in ``plans``' order; see the module docstring) and notes to log
    (none: every run can be grouped). ConfigError (one line, nothing started) for a bad
    ``group_size`` / ``workers`` or a device that does not resolve here."""
    _check(group_size, workers)
    keyed: dict[tuple, list[str]] = {}
    for plan in plans:
        why = device_refusal(plan.config)
        if why is not None:
            raise C.ConfigError(f"condition {plan.condition}: {why}")
        keyed.setdefault(group_key(plan.config), []).append(plan.name)
    groups = []
    for names in keyed.values():
        parts = min(workers or 1, len(names))
        size = -(-len(names) // parts)
        if group_size is not None:
            size = min(size, group_size)
        groups += [names[i:i + size] for i in range(0, len(names), size)]
    return groups, []
