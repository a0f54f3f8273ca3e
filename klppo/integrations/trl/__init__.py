"""klppo's KL controllers inside TRL's trainers (the trl extra).

:func:`attach` puts a :class:`KLControlCallback` on a TRL ``GRPOTrainer`` or ``RLOOTrainer``::

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(beta=0.04, ...), ...)
    attach(trainer, "proportional", target=0.05, horizon=10_000, beta_min=1e-4)
    trainer.train()

After every training log the controller is fed the trainer's KL (GRPO: read per token from each
loss call, in the unit beta multiplies for its ``loss_type`` unless ``unit`` names another;
RLOO: the logged KL, converted with the batch's mean completion length when the target is per
sequence), and ``trainer.beta`` takes the controller's new value. The controller's state is
saved in every checkpoint and restored by ``resume_from_checkpoint``. What each trainer's beta
means, the units and the estimators: ``docs/integrations.md``.

TRL's internals change between lines: a TRL is accepted when its trainers' source has the lines
this integration reads (:data:`~klppo.integrations.trl.trainers.INTERNALS`); the lines tested
are ``TESTED_TRL``.
"""

from __future__ import annotations

from klppo.runs.install import install_hint

try:
    import transformers  # noqa: F401
    import trl  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"klppo.integrations.trl needs TRL: {install_hint('trl')}") from err

from klppo.integrations.trl.attaching import attach  # noqa: E402
from klppo.integrations.trl.callback import PREFIX, KLControlCallback  # noqa: E402
from klppo.integrations.trl.entropy import (  # noqa: E402
    ENTROPY_STATE_FILE,
    EntropyControlCallback,
    attach_entropy,
)
from klppo.integrations.trl.grpo_kl import LOSS_UNITS, UNIT_MEANINGS  # noqa: E402
from klppo.integrations.trl.state import STATE_FILE  # noqa: E402
from klppo.integrations.trl.trainers import (  # noqa: E402
    TESTED_TRL,
    TRAINERS,
    UNITS,
    TrainerKL,
    TRLIntegrationError,
)

__all__ = ["attach", "KLControlCallback", "TRLIntegrationError", "TRAINERS", "TrainerKL",
           "UNITS", "TESTED_TRL", "STATE_FILE", "PREFIX", "LOSS_UNITS", "UNIT_MEANINGS",
           "attach_entropy", "EntropyControlCallback", "ENTROPY_STATE_FILE"]
