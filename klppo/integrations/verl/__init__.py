"""klppo's controllers inside verl: the KL in the reward (:func:`attach`, verl's
``kl_ctrl_in_reward``) and the actor's loss-side coefficients (:func:`attach_loss`,
``kl_loss_coef`` and ``entropy_coeff`` through the workers' loss function), each with its state
in verl's checkpoints. Needs no verl to import; ``docs/integrations.md`` says what was tested."""

from klppo.integrations.verl._checks import VerlIntegrationError
from klppo.integrations.verl.loss import (
    LOSS_FORMAT,
    LOSS_STATE_FILE,
    UNITS,
    LossControl,
    attach_loss,
)
from klppo.integrations.verl.reward import FED_UNIT, FORMAT, RewardKLControl, attach

__all__ = ["RewardKLControl", "attach", "FORMAT", "FED_UNIT", "VerlIntegrationError",
           "LossControl", "attach_loss", "UNITS", "LOSS_FORMAT", "LOSS_STATE_FILE"]
