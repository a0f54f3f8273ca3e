"""``attach``: a klppo controller onto a TRL trainer (the checks before training, the defaults
of a controller built by name), returning its :class:`~klppo.integrations.trl.callback.
KLControlCallback`."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from klppo.core.controllers import (
    PIDKL,
    KLController,
    make_controller,
    relative_pid_gains,
)
from klppo.core.kl_gradient_claims import KL_NAMES, KLGradientWarning
from klppo.integrations.trl.callback import KLControlCallback
from klppo.integrations.trl.grpo_kl import KLTap
from klppo.integrations.trl.trainers import (
    UNITS,
    TrainerKL,
    TRLIntegrationError,
    check_internals,
    conversion_problem,
    penalised_unit,
    resolve,
)
from klppo.integrations.trl_gradients import grpo_setting
from klppo.runs.typecheck import short_repr

__all__ = ["attach"]


def attach(trainer: Any, controller: KLController | str, *, unit: str | None = None,
           **options: Any) -> KLControlCallback:
    """Drive ``trainer.beta`` (TRL ``GRPOTrainer`` or ``RLOOTrainer``) from a klppo controller.

    Args:
        trainer: the TRL trainer, built with its initial beta > 0.
        controller: a :class:`~klppo.core.controllers.KLController`, or a controller name for
            :func:`~klppo.core.controllers.make_controller` with ``options`` (``beta`` defaults
            to the trainer's). Its target is in ``unit``, nats of KL(policy || reference). A
            controller built by name but ``pid`` holds beta until the KL first reaches the
            target (``hold=True``; pass ``hold=False`` to feed it the ramp from 0, or
            ``hold_limit=N`` to release it after N updates whatever the KL), ``beta_min``
            defaults to 1e-4 (TRL drops the KL at beta 0); ``pid`` gets the
            gains not given from :func:`~klppo.core.controllers.relative_pid_gains` (``kp =
            1 / target``, ``ki = 0.15 / target``: what held SmolLM2 in GRPO), and
            ``proportional`` without a ``horizon`` (or ``horizon="auto"``) gets one derived from
            the run when training starts: beta can move by a factor of 20 within a quarter of
            the run's updates (:func:`~klppo.core.controllers.run_horizon`).
        unit: the unit of the target and of the KL fed to the controller; default: the unit
            beta multiplies (GRPO: its ``loss_type``'s, see ``docs/integrations.md``; RLOO:
            ``per_sequence_sum``). GRPO serves every unit of
            :data:`~klppo.integrations.trl.grpo_kl.UNIT_MEANINGS` exactly (the KL is read per
            token); RLOO ``per_token_mean`` (logged) and ``per_sequence_sum`` (converted with the
            logged mean completion length of the same batch).

    Returns the callback, inserted right after transformers' flow callback so the log
    reporters (TensorBoard, W&B, the progress printer) see the ``klppo/*`` metrics.
    Raises :class:`TRLIntegrationError` (one line) for anything that cannot work, before
    training starts; warns (:class:`ControllerBoundWarning`) when the controller asks for a beta
    beyond ``beta_min`` / ``beta_max`` (the target is out of reach within the bounds); warns
    (:class:`~klppo.core.kl_gradient_claims.KLGradientWarning`) when GRPO's KL term descends,
    per token, another KL than KL(policy || reference).
    """
    spec = resolve(trainer)
    check_internals(spec.class_name)
    unit = penalised_unit(spec, trainer.args) if unit is None else unit
    _check_unit(spec, trainer.args, unit)
    if trainer.args.logging_strategy == "no":
        raise TRLIntegrationError("logging_strategy='no': the controller is fed on each log")
    _check_reference(trainer)
    if spec.name == "grpo":
        _check_grpo_gradient(trainer.args)
    auto = isinstance(controller, str) and controller == "proportional" and \
        options.get("horizon", "auto") == "auto"
    if isinstance(controller, str):
        options = _string_defaults(controller, options)
    ctrl = _controller(trainer, spec, controller, options)
    if any(isinstance(c, KLControlCallback) for c in trainer.callback_handler.callbacks):
        raise TRLIntegrationError(f"{spec.class_name}: a klppo controller is already attached")
    tap = KLTap(trainer) if spec.name == "grpo" else None
    cb = KLControlCallback(trainer, ctrl, unit, spec, tap, auto_horizon=auto)
    callbacks = trainer.callback_handler.callbacks
    first = next((i + 1 for i, c in enumerate(callbacks)
                  if type(c).__name__ == "DefaultFlowCallback"), 0)
    callbacks.insert(first, cb)
    return cb


#: the floor of a controller built by name without ``beta_min``
DEFAULT_BETA_MIN = 1e-4

#: PIDKL's own default target (the gains of a pid built without one are relative to it)
_PID_TARGET = inspect.signature(PIDKL).parameters["target"].default


def _string_defaults(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A controller built by name holds beta until the KL first reaches its target
    (``hold``; the KL to the reference starts at 0), except ``pid``, whose integral cannot go
    below 0 (its anti-windup does what the hold does for a weak start, and a hold would keep a
    strong start forever), and whose gains not given are
    :func:`~klppo.core.controllers.relative_pid_gains` of the target; ``proportional`` without
    a horizon, or
    with ``horizon="auto"``, gets one derived from the run's length and batch when training
    starts (:func:`~klppo.core.controllers.run_horizon`; 10000 until then)."""
    out = dict(options)
    if name != "fixed" and out.get("beta_min") is None:
        out["beta_min"] = DEFAULT_BETA_MIN  # at beta 0 TRL drops the KL: beta could not come back
    if name not in ("fixed", "pid") and out.get("target") is not None:
        out.setdefault("hold", True)
    if name == "pid" and out.get("hold_limit") is not None:
        out.setdefault("hold", True)  # a hold limit asks for a hold
    if name == "pid":
        target = out.get("target")
        target = _PID_TARGET if target is None else target
        try:
            gains = relative_pid_gains(target)
        except (TypeError, ValueError) as e:
            raise TRLIntegrationError(f"controller='pid': {e}") from None
        for gain, value in gains.items():
            if out.get(gain) is None:
                out[gain] = value
    if name == "proportional" and out.get("horizon", "auto") == "auto":
        out["horizon"] = 10000.0
    return out


def _check_reference(trainer: Any) -> None:
    """A reference that moves during training (TRL's ``sync_ref_model``, the experimental BEMA
    reference callback) resets the KL the target is about every few steps, and a controller's
    state (a PID integral, a proportional rule's beta) would chase those resets: refused."""
    if getattr(trainer.args, "sync_ref_model", False):
        raise TRLIntegrationError(
            "sync_ref_model=True: TRL moves the reference towards the policy every "
            f"ref_model_sync_steps={getattr(trainer.args, 'ref_model_sync_steps', '?')} steps, so "
            "the KL the target is about restarts near 0 each time; a controller cannot hold it "
            "(klppo rlhf --ref-reset-every keeps the controller across resets)")
    for c in trainer.callback_handler.callbacks:
        if type(c).__module__.startswith("trl.experimental.bema_for_ref_model"):
            raise TRLIntegrationError(
                f"{type(c).__name__} from trl.experimental.bema_for_ref_model: it replaces the "
                "reference model with the policy's moving average during training, so the KL "
                "the target is about moves with it; remove it or the controller")


def _check_unit(spec: TrainerKL, args: Any, unit: Any) -> None:
    allowed = UNITS if spec.name == "grpo" else ("per_token_mean", "per_sequence_sum")
    if unit not in allowed:
        raise TRLIntegrationError(f"unit={short_repr(unit)}: must be one of {', '.join(allowed)}"
                                  f" for {spec.class_name}")
    if spec.name != "grpo" and unit != spec.logged_unit:
        why = conversion_problem(spec, args)
        if why is not None:
            raise TRLIntegrationError(
                f"unit={unit!r}: {spec.class_name} logs a {spec.logged_unit} KL, and with "
                f"{why}; use unit={spec.logged_unit!r} or change those settings")


def _check_grpo_gradient(args: Any) -> None:
    """Refuse GSPO's sequence ratio on the KL; warn when, per token, the KL term's expected
    gradient is not that of KL(policy || reference) (``klppo verify``, section TRL GRPO)."""
    level, bc = args.importance_sampling_level, bool(args.use_bias_correction_kl)
    if level == "sequence" and bc:
        raise TRLIntegrationError(
            "importance_sampling_level='sequence' with use_bias_correction_kl=True: TRL "
            "multiplies each token's k3 by GSPO's length-normalised sequence ratio, whose "
            "gradient is neither KL's, per token or over the sequence (klppo verify, section TRL "
            "GRPO; TRL's docstring: the correction holds at token level only); set "
            "use_bias_correction_kl=False or importance_sampling_level='token'")
    passes = (True, False) if args.num_iterations > 1 else (True,)
    for setting in (grpo_setting(level, bc, first) for first in passes):
        if setting.one_token != "reverse":
            warnings.warn(
                f"TRL GRPO with {setting.describe()}: the KL term's expected gradient is, per "
                f"token, that of {KL_NAMES[setting.one_token]}; use_bias_correction_kl=True with "
                "importance_sampling_level='token' gives KL(policy || reference) per token "
                "(klppo verify, section TRL GRPO)", KLGradientWarning, stacklevel=3)
            return


def _controller(trainer: Any, spec: TrainerKL, controller: KLController | str,
                options: dict[str, Any]) -> KLController:
    beta = float(getattr(trainer, spec.beta_attr))
    if not isinstance(controller, (str, KLController)):
        raise TRLIntegrationError(
            f"controller={short_repr(controller)}: must be a klppo KLController or a controller "
            f"name (fixed, step, proportional, exponential, pid)")
    if isinstance(controller, str):
        try:
            ctrl = make_controller(controller, **{"beta": beta, **options})  # type: ignore[arg-type]
        except ValueError as e:
            raise TRLIntegrationError(f"controller={controller!r}: {e}") from None
    elif options:
        raise TRLIntegrationError(f"options {sorted(options)}: given with a controller object; "
                                  "set them on the controller")
    else:
        ctrl = controller
    if ctrl.value != beta:
        raise TRLIntegrationError(
            f"controller beta={ctrl.value} but {spec.class_name}.beta={beta}: build the trainer "
            "with the controller's initial beta (TRL decides at construction whether to load "
            "the reference model)")
    if ctrl.name != "fixed" and not ctrl.beta_min > 0:
        raise TRLIntegrationError(
            f"controller beta_min={ctrl.beta_min}: must be > 0 (e.g. 1e-6); at beta 0 TRL skips "
            "the reference model and the KL, so the controller could never raise it again")
    return ctrl
