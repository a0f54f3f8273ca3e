"""klppo's controllers on verl's loss side: the KL-loss and entropy coefficients of the actor.

verl (0.9) puts the KL to the reference in the actor's loss with
``actor_rollout_ref.actor.use_kl_loss=True``: ``workers/utils/losses.ppo_loss`` adds
``kl_loss * config.kl_loss_coef`` (``kl_loss`` the ``kl_loss_type`` estimator aggregated by
``loss_agg_mode``) and subtracts ``config.entropy_coeff * entropy_loss``, reading both
coefficients from the config it is bound to on every call. The actor workers hold that function
(``partial(ppo_loss, config=actor_config)``) and ``ActorRolloutRefWorker.set_loss_fn``,
dispatched to every worker, replaces it. The update returns ``actor/kl_loss`` (and
``actor/entropy_loss``) in its metrics: the very terms the coefficients multiplied, averaged over
the update's mini-batches and epochs.

:func:`attach_loss` wraps the trainer's ``_update_actor`` (on that object only): after each
update it feeds those two numbers to klppo controllers, then sends the workers
``partial(ppo_loss, config=actor_config)`` with the new coefficients, where ``actor_config`` is
the actor's own section of the trainer's config, built as the workers build it. The state of
both controllers is written beside every checkpoint (``klppo_loss_control.json``) and read back
on resume, when the restored coefficients are sent to the workers again.

Units: the KL's and the entropy's are the ``loss_agg_mode``'s (:data:`UNITS`); the KL is in
nats of the ``kl_loss_type`` estimator (``low_var_kl``: k3, clamped to [-10, 10] by verl).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

from klppo.core.controllers import KLController
from klppo.core.entropy_control import EntropyControl
from klppo.integrations import controller_state as S
from klppo.integrations.verl._checks import (
    VerlIntegrationError,
    build_controller,
    hook_checkpoints,
    number,
    starts_at,
)

__all__ = ["LossControl", "attach_loss", "UNITS", "LOSS_FORMAT", "LOSS_STATE_FILE"]

LOSS_FORMAT = "klppo.integrations.verl.loss/1"
LOSS_STATE_FILE = "klppo_loss_control.json"
#: the unit of ``actor/kl_loss`` and ``actor/entropy_loss`` per ``loss_agg_mode`` (``token-sum``,
#: a sum over the whole mini-batch, has none a target could name: refused)
UNITS = {
    "token-mean": "per_token_mean",
    "seq-mean-token-mean": "per_sequence_mean",
    "seq-mean-token-sum": "per_sequence_sum",
    "seq-mean-token-sum-norm": "per_sequence_sum / loss_scale_factor",
}
#: the metrics the update returns: the terms the coefficients multiplied, and the coefficient used
KL_METRIC, KL_COEF_METRIC, ENTROPY_METRIC = "actor/kl_loss", "actor/kl_coef", "actor/entropy_loss"


class LossControl:
    """The actor's loss-side coefficients, each driven by a klppo controller (or left at its
    configured value when none is given). ``history`` holds one record per update."""

    def __init__(self, actor_config: Any, unit: str, kl: KLController | None = None,
                 entropy: EntropyControl | None = None) -> None:
        self.actor_config, self.unit, self.kl, self.entropy = actor_config, unit, kl, entropy
        self.history: list[dict[str, float]] = []

    @property
    def kl_coef(self) -> float:
        """The KL-loss coefficient the workers' loss uses."""
        return self.kl.value if self.kl is not None else float(self.actor_config.kl_loss_coef)

    @property
    def entropy_coeff(self) -> float:
        """The entropy coefficient the workers' loss uses."""
        return self.entropy.value if self.entropy is not None else \
            float(self.actor_config.entropy_coeff)

    def loss_fn(self) -> functools.partial:
        """verl's own ``ppo_loss`` bound to the actor config with the current coefficients."""
        from verl.workers.utils.losses import ppo_loss

        cfg = dataclasses.replace(self.actor_config, kl_loss_coef=self.kl_coef,
                                  entropy_coeff=self.entropy_coeff)
        return functools.partial(ppo_loss, config=cfg)

    def observe(self, metrics: dict[str, Any], n_steps: int) -> dict[str, float]:
        """Feed one update's metrics (``actor_output.meta_info["metrics"]``, before verl reduces
        them) to the controllers; return the ``klppo/*`` numbers to log."""
        reduced = _reduced(metrics, [k for k, c in ((KL_METRIC, self.kl),
                                                    (KL_COEF_METRIC, self.kl),
                                                    (ENTROPY_METRIC, self.entropy)) if c])
        rec: dict[str, float] = {"n_steps": n_steps}
        if self.kl is not None:
            used = reduced[KL_COEF_METRIC]
            if not math.isclose(used, self.kl.value, rel_tol=1e-9, abs_tol=1e-15):
                raise RuntimeError(f"{KL_COEF_METRIC}={used!r}: the workers' loss used another "
                                   f"coefficient than the controller's {self.kl.value!r}")
            rec.update(kl=reduced[KL_METRIC], kl_coef=self.kl.value,
                       kl_coef_next=self.kl.update(reduced[KL_METRIC], n_steps=n_steps))
        if self.entropy is not None:
            rec.update(entropy=reduced[ENTROPY_METRIC], entropy_coeff=self.entropy.value,
                       entropy_coeff_next=self.entropy.update(reduced[ENTROPY_METRIC],
                                                              n_steps=n_steps))
        self.history.append(rec)
        return {f"klppo/{k}": v for k, v in rec.items()}

    # ------------------------------------------------------------------ checkpoints
    def identity(self) -> dict[str, Any]:
        """What a checkpoint's state must match: the unit and each controller's rule and
        bounds."""
        return {"unit": self.unit,
                "kl": None if self.kl is None else S.settings_of(self.kl),
                "entropy": None if self.entropy is None else S.settings_of(self.entropy.rule)}

    def save(self, folder: Path, global_step: int) -> Path:
        """Write both controllers' state into ``folder`` (a ``global_step_N`` folder)."""
        return S.write_state(folder, {
            **self.identity(), "global_step": global_step,
            "kl_state": None if self.kl is None else self.kl.state_dict(),
            "entropy_state": None if self.entropy is None else self.entropy.state_dict()},
            LOSS_FORMAT, LOSS_STATE_FILE)

    def load(self, folder: Path, global_step: int) -> None:
        """Restore the state saved in ``folder`` at ``global_step``; RuntimeError (one line
        naming the file) when it is missing or was written by other controllers."""
        saved = S.read_state(folder, {**self.identity(), "global_step": global_step},
                             LOSS_FORMAT, LOSS_STATE_FILE)
        if self.kl is not None:
            S.load_controller(self.kl, {"controller": saved.get("kl_state")}, folder,
                              LOSS_STATE_FILE)
        if self.entropy is not None:
            S.load_controller(self.entropy, {"controller": saved.get("entropy_state")}, folder,
                              LOSS_STATE_FILE)


def _reduced(metrics: dict[str, Any], keys: list[str]) -> dict[str, float]:
    """verl's own reduction (``reduce_metrics``, what it logs) of each of ``keys``; one line
    naming a metric the update did not return."""
    from verl.utils.metric import reduce_metrics

    missing = [k for k in keys if k not in metrics]
    if missing:
        raise RuntimeError(f"the actor update returned no {missing} metric: the coefficient "
                           "cannot be fed the term it multiplies")
    return {k: number(k, v) for k, v in
            reduce_metrics({k: copy.deepcopy(metrics[k]) for k in keys}).items()}


def attach_loss(trainer: Any, kl: KLController | str | None = None, *,
                entropy: EntropyControl | KLController | str | None = None,
                kl_options: dict[str, Any] | None = None,
                entropy_options: dict[str, Any] | None = None) -> LossControl:
    """Drive the actor's ``kl_loss_coef`` (``kl``) and/or ``entropy_coeff`` (``entropy``) of a
    verl ``RayPPOTrainer`` from klppo controllers, before ``init_workers``.

    Args:
        trainer: the trainer, its config complete (``actor_rollout_ref.actor`` builds).
        kl: a :class:`~klppo.core.controllers.KLController` or a controller name with
            ``kl_options`` (``beta`` defaults to ``actor.kl_loss_coef``); its target is in
            ``UNITS[loss_agg_mode]``, nats of the ``kl_loss_type`` estimator.
        entropy: an :class:`~klppo.core.entropy_control.EntropyControl`, a controller (the
            rule, its beta the coefficient), or a rule name with ``entropy_options`` (``target``
            entropy in nats, ``coef`` defaults to ``actor.entropy_coeff``).

    Raises :class:`VerlIntegrationError` (one line) for anything that cannot work.
    """
    actor = _actor_section(trainer)
    unit = _unit(actor.loss_agg_mode)
    kl_ctrl = None if kl is None else _kl_rule(actor, kl, kl_options or {})
    ent = None if entropy is None else _entropy_rule(actor, entropy, entropy_options or {})
    if kl_ctrl is None and ent is None:
        raise VerlIntegrationError("attach_loss: give kl, entropy or both")
    control = LossControl(_actor_config(actor), unit, kl_ctrl, ent)
    update = trainer._update_actor

    def _update_actor(batch: Any, *args: Any, **kwargs: Any) -> Any:
        out = update(batch, *args, **kwargs)
        out.meta_info["metrics"].update(control.observe(out.meta_info["metrics"], len(batch)))
        trainer.actor_rollout_wg.set_loss_fn(control.loss_fn())
        return out

    def _restore(folder: Path, step: int) -> None:
        control.load(folder, step)
        trainer.actor_rollout_wg.set_loss_fn(control.loss_fn())

    trainer._update_actor = _update_actor
    hook_checkpoints(trainer, control.save, _restore)
    return control


def _actor_section(trainer: Any) -> Any:
    if not callable(getattr(trainer, "_update_actor", None)):
        raise VerlIntegrationError(f"{type(trainer).__name__}: no _update_actor; attach_loss "
                                   "drives verl's RayPPOTrainer (verl 0.9)")
    cfg = trainer.config
    if cfg.get("distillation") is not None and cfg.distillation.get("enabled", False):
        raise VerlIntegrationError("distillation.enabled=True: the workers' loss is then "
                                   "distillation_ppo_loss, which attach_loss does not drive")
    return cfg.actor_rollout_ref.actor


def _unit(mode: str) -> str:
    if mode not in UNITS:
        raise VerlIntegrationError(f"actor.loss_agg_mode={mode!r}: its KL and entropy terms "
                                   f"are sums over the whole mini-batch; use one of {list(UNITS)}")
    return UNITS[mode]


def _kl_rule(actor: Any, given: KLController | str, options: dict[str, Any]) -> KLController:
    if not actor.use_kl_loss:
        raise VerlIntegrationError("actor_rollout_ref.actor.use_kl_loss=False: there is no KL "
                                   "in the loss for a controller to weigh")
    start = number("actor_rollout_ref.actor.kl_loss_coef", actor.kl_loss_coef)
    ctrl = build_controller(given, {"beta": start, **options} if isinstance(given, str)
                            else options)
    starts_at("the KL controller", ctrl.value, actor.kl_loss_coef,
              "actor_rollout_ref.actor.kl_loss_coef")
    return ctrl


def _entropy_rule(actor: Any, given: EntropyControl | KLController | str,
                  options: dict[str, Any]) -> EntropyControl:
    if not (actor.get("calculate_entropy", False) or actor.entropy_coeff != 0):
        raise VerlIntegrationError("actor_rollout_ref.actor.entropy_coeff=0 and "
                                   "calculate_entropy=False: verl computes no entropy then; set "
                                   "calculate_entropy=True")
    start = number("actor_rollout_ref.actor.entropy_coeff", actor.entropy_coeff)
    if isinstance(given, str):
        rule = build_controller(given, {"beta": start, **options})
    elif isinstance(given, EntropyControl):
        if options:
            raise VerlIntegrationError(f"entropy_options {sorted(options)}: given with a "
                                       "controller object; set them on the controller")
        rule = given.rule
    else:
        rule = build_controller(given, options)
    starts_at("the entropy controller", rule.value, actor.entropy_coeff,
              "actor_rollout_ref.actor.entropy_coeff")
    try:
        return given if isinstance(given, EntropyControl) else EntropyControl(rule)
    except ValueError as e:
        raise VerlIntegrationError(f"entropy: {e}") from None


def _actor_config(actor: Any) -> Any:
    """The actor's dataclass config, built as verl's workers build it."""
    from verl.utils.config import omega_conf_to_dataclass

    try:
        return omega_conf_to_dataclass(actor)
    except Exception as e:  # hydra wraps the config's own checks
        raise VerlIntegrationError(
            f"actor_rollout_ref.actor: verl cannot build it ({str(e).splitlines()[0]})") from None
