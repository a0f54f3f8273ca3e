"""An entropy coefficient driven to a target entropy by any of klppo's controller rules.

Entropy collapse is the failure LLM-RL users ask their trainers to control (TRL #3320 / #6140,
verl #1234): the bonus ``-c H`` keeps the policy's entropy up, and its coefficient ``c`` should
rise when the entropy falls below a target and fall when it is above. TRL 1.16's
``use_adaptive_entropy`` moves ``c`` by a fixed step; klppo drives it with any rule of
:mod:`klppo.core.controllers` (fixed, step, proportional, exponential, pid), bounded to
``[coef_min, coef_max]``, with its state saved for an exact resume.

A KL rule raises beta when the KL is *above* its target; the entropy coefficient must rise when
the entropy is *below* it. The rule is therefore fed the entropy mirrored about the target,
``d = 2 * target - H``: every rule's error is ``d - target`` or ``d / target - 1``, which becomes
``target - H`` or ``1 - H / target``, the entropy's error with its sign flipped, and nothing else
about the rule changes (its gains, bands, clip and bounds keep their meaning, in nats of
entropy).
"""

from __future__ import annotations

from typing import Any

from klppo.core.controller_base import KLController
from klppo.core.controllers import make_controller

__all__ = ["EntropyControl", "make_entropy_control"]


class EntropyControl:
    """The coefficient of the entropy bonus (``value``), moved towards ``target`` entropy by
    ``rule`` (a klppo controller whose target is the target entropy and whose beta is the
    coefficient)."""

    def __init__(self, rule: KLController) -> None:
        if rule.target is None:
            raise ValueError(f"the entropy rule {rule.name!r} needs a target entropy")
        self.rule = rule

    @property
    def value(self) -> float:
        """The current entropy coefficient."""
        return self.rule.value

    @property
    def target(self) -> float:
        """The target entropy (nats, in the unit of the entropy fed)."""
        assert self.rule.target is not None  # checked at construction
        return self.rule.target

    def update(self, entropy: float, n_steps: int = 1) -> float:
        """Feed one entropy measurement; return the new coefficient."""
        return self.rule.update(2.0 * self.target - float(entropy), n_steps=n_steps)

    def state_dict(self) -> dict[str, Any]:
        """The rule's state (restores the coefficient and every integrator)."""
        return self.rule.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rule.load_state_dict(state)


def make_entropy_control(name: str, coef: float, target: float, coef_min: float = 0.0,
                         coef_max: float = 1.0, **options: Any) -> EntropyControl:
    """An :class:`EntropyControl` with rule ``name`` starting at ``coef``; ``options`` are the
    rule's own settings (e.g. ``horizon``, ``kp``)."""
    return EntropyControl(make_controller(name, beta=coef, target=target,  # type: ignore[arg-type]
                                          beta_min=coef_min, beta_max=coef_max, **options))
