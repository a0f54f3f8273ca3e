"""klppo's KL controllers in verl's reward-side KL control, with their state in its checkpoints.

verl (0.9) penalises the reward with ``algorithm.use_kl_in_reward=True``: its
``ray_trainer.apply_kl_penalty`` subtracts ``beta * kl_t`` from every response token's score
(``kl_t`` = ``core_algos.kl_penalty(old_log_probs, ref_log_prob, algorithm.kl_penalty)``), then
calls ``kl_ctrl.update(current_kl, n_steps=batch_size)`` with ``current_kl`` the mean over the
batch's responses of each response's token mean. Its controller (``core_algos.get_kl_controller``:
``FixedKLController`` or ``AdaptiveKLController``) is an object with ``.value`` and
``.update(current_kl, n_steps)`` that no checkpoint saves (verl #2653).

:class:`RewardKLControl` is that object for any klppo controller, and :func:`attach` puts it on a
``RayPPOTrainer`` (``trainer.kl_ctrl_in_reward``) with its state written beside every checkpoint
and read back on resume::

    trainer = RayPPOTrainer(config=..., ...)   # config.algorithm.use_kl_in_reward=True
    attach(trainer, "pid", target=0.05, kp=0.1, ki=0.01, beta=config.algorithm.kl_ctrl.kl_coef)
    trainer.init_workers(); trainer.fit()

Units: the target is in the unit verl feeds, ``per_sequence_mean`` (nats per token, each response
weighted equally), while beta multiplies each token's KL in the reward, which the returns sum
over the response. Needs no verl to import; ``docs/integrations.md`` says what was tested.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klppo.core.controllers import KLController
from klppo.integrations import controller_state as S
from klppo.integrations.verl._checks import (
    VerlIntegrationError,
    build_controller,
    count,
    hook_checkpoints,
    number,
    starts_at,
)

__all__ = ["RewardKLControl", "attach", "FORMAT", "FED_UNIT"]

FORMAT = "klppo.integrations.verl/1"
#: the unit of ``current_kl`` that ``apply_kl_penalty`` feeds its controller
FED_UNIT = "per_sequence_mean"


class RewardKLControl:
    """verl's KL-controller interface (``value``, ``update(current_kl, n_steps)``) over a klppo
    controller. ``history`` holds one record per update: the KL fed, the beta used and the
    beta after."""

    def __init__(self, controller: KLController | str, **options: Any) -> None:
        self.controller = build_controller(controller, options)
        self.history: list[dict[str, float]] = []

    @property
    def value(self) -> float:
        """The beta ``apply_kl_penalty`` multiplies each token's KL by."""
        return self.controller.value

    @property
    def target(self) -> float | None:
        """The target, in :data:`FED_UNIT` (nats of KL(policy || reference))."""
        return self.controller.target

    def update(self, current_kl: float, n_steps: int) -> None:
        """verl's call after each batch: the batch's KL (``per_sequence_mean``) and its number of
        responses."""
        kl, n = number("current_kl", current_kl), count("n_steps", n_steps)
        beta = self.controller.value
        self.controller.update(kl, n_steps=n)
        self.history.append({"kl": kl, "beta": beta, "beta_next": self.controller.value,
                             "n_steps": n})

    def identity(self) -> dict[str, Any]:
        """What a checkpoint's state must match: the unit and the controller's rule and bounds."""
        return {"unit": FED_UNIT, "settings": S.settings_of(self.controller)}

    def save(self, folder: Path, global_step: int) -> Path:
        """Write the state into ``folder`` (a ``global_step_N`` checkpoint folder)."""
        return S.write_state(folder, {**self.identity(), "global_step": global_step,
                                      "controller": self.controller.state_dict()}, FORMAT)

    def load(self, folder: Path, global_step: int) -> None:
        """Restore the state saved in ``folder`` at ``global_step``; RuntimeError (one line
        naming the file) when it is missing or was written by another controller."""
        saved = S.read_state(folder, {**self.identity(), "global_step": global_step}, FORMAT)
        S.load_controller(self.controller, saved, folder)


def attach(trainer: Any, controller: KLController | str, **options: Any) -> RewardKLControl:
    """Replace ``trainer.kl_ctrl_in_reward`` (a verl ``RayPPOTrainer`` with
    ``algorithm.use_kl_in_reward=True``) by a :class:`RewardKLControl` over ``controller`` (a klppo
    controller, or a controller name with ``options``; ``beta`` defaults to
    ``algorithm.kl_ctrl.kl_coef``), and make the trainer's ``_save_checkpoint`` /
    ``_load_checkpoint`` (on this object only) save and restore it."""
    cfg = trainer.config
    if not cfg.algorithm.use_kl_in_reward:
        raise VerlIntegrationError("algorithm.use_kl_in_reward=False: verl applies no reward-side "
                                   "KL, so there is no coefficient to drive")
    kl_coef = number("algorithm.kl_ctrl.kl_coef", cfg.algorithm.kl_ctrl.kl_coef)
    ctrl = RewardKLControl(controller, **{"beta": kl_coef, **options}
                           if isinstance(controller, str) else options)
    starts_at("the controller", ctrl.value, cfg.algorithm.kl_ctrl.kl_coef,
              "algorithm.kl_ctrl.kl_coef")
    trainer.kl_ctrl_in_reward = ctrl
    hook_checkpoints(trainer, ctrl.save, ctrl.load)
    return ctrl
