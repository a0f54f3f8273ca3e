"""The ``TrainerCallback`` that drives a TRL trainer's beta from a klppo controller.

Cadence: one controller update per training log that holds the trainer's KL (``logging_steps``
optimiser steps). The update happens in ``on_log``, after TRL has averaged the window's metrics
and before the checkpoint of the same step is written, so the new beta is used from the next
optimiser step on and is part of that checkpoint.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from klppo.core.controllers import KLController, ProportionalKL, make_controller, run_horizon
from klppo.core.kl_gradient_claims import KL_NAMES, KLGradientWarning
from klppo.integrations.trl import state as S
from klppo.integrations.trl.grpo_kl import KLTap
from klppo.integrations.trl.trainers import (
    UNITS,
    TrainerKL,
    TRLIntegrationError,
    check_internals,
    conversion_problem,
    penalised_unit,
    resolve,
    to_unit,
)
from klppo.integrations.trl_gradients import grpo_setting
from klppo.runs.typecheck import short_repr

log = logging.getLogger(__name__)

__all__ = ["KLControlCallback", "ControllerBoundWarning", "attach", "PREFIX"]


class ControllerBoundWarning(UserWarning):
    """The controller asks for a beta beyond its bounds: the KL target is out of its reach."""

#: prefix of the metrics the callback adds to the trainer's logs
PREFIX = "klppo/"


class KLControlCallback(TrainerCallback):
    """Feeds ``controller`` the trainer's KL in ``unit`` and writes the new beta into the
    trainer. Build it with :func:`attach`, which checks everything first.

    GRPO: the KL of the window's loss calls, read per token (``tap``): in the penalised unit
    the KL term of TRL's loss per optimiser step, exactly as TRL reduces it, in another unit the
    window's tokens pooled; RLOO: the KL the trainer logged, converted with the logged mean
    completion length.
    ``history`` holds one record per training log: the logged KL (TRL's value, its estimator,
    direction and unit), the value fed to the controller (in ``unit``), the KL in the unit beta
    multiplies (``kl_penalised``, GRPO), the mean completion length, the beta used during the
    window and the beta after the update.
    """

    def __init__(self, trainer: Any, controller: KLController, unit: str,
                 spec: TrainerKL, tap: KLTap | None = None, auto_horizon: bool = False) -> None:
        self.trainer, self.controller, self.unit, self.spec = trainer, controller, unit, spec
        self.tap = tap
        self.auto_horizon = auto_horizon
        self._at_bound: str | None = None
        self._quarter_warned = False
        self.penalised_unit = penalised_unit(spec, trainer.args)
        self.history: list[dict[str, Any]] = []
        self._last_update_step = 0
        self._beta_set = float(getattr(trainer, spec.beta_attr))

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, **kwargs):
        if self.auto_horizon:
            self._derive_horizon(args, state)
        if state.global_step > 0:
            self._restore(Path(args.output_dir) / f"checkpoint-{state.global_step}",
                          state.global_step)
        elif self.controller.num_updates:
            raise RuntimeError(
                f"controller has been updated {self.controller.num_updates} times already: a "
                "new training run needs a fresh controller (or resume_from_checkpoint)")
        self._set_beta(self.controller.value)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:  # evaluation logs and the end-of-training summary
            return
        rec = self._update(args, state, logs)
        self._warn_at_bound(rec)
        self._warn_not_reached(rec, state)
        numbers = {f"{PREFIX}{k}": rec[k] for k in ("kl", "kl_penalised", "kl_target", "beta",
                                                    "beta_next",
                                                    "relative_error", "error_clipped",
                                                    "mean_length", "n_steps", "updated",
                                                    "held", "at_bound",
                                                    *(k for k in rec if k.startswith("mismatch_")))
                   if rec.get(k) is not None}
        logs.update(numbers)  # the reporters after this callback (attach puts it first) see them
        last = state.log_history[-1] if state.log_history else None
        if last is not None and last.get("step") == state.global_step and \
                last.get("loss") == logs["loss"]:
            last.update(numbers)  # trainer_state.json (saved with the checkpoint) keeps them

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not ckpt.is_dir():
            raise RuntimeError(f"{ckpt}: the trainer's checkpoint is not where the callback "
                               "expects it (output_dir/checkpoint-STEP)")
        S.write_state(ckpt, {**self._identity(), "global_step": state.global_step,
                             "last_update_step": self._last_update_step,
                             "controller": self.controller.state_dict()})

    # ------------------------------------------------------------------ pieces
    def _samples_per_update(self, args: Any) -> int:
        return int(args.logging_steps * args.per_device_train_batch_size
                   * args.gradient_accumulation_steps * args.world_size)

    @staticmethod
    def _updates(args: Any, state: Any) -> int:
        """The controller updates this run makes: one per training log."""
        return max(1, int(state.max_steps) // max(1, int(args.logging_steps)))

    def _derive_horizon(self, args: Any, state: Any) -> None:
        """``horizon="auto"``: :func:`~klppo.core.controllers.run_horizon` of this run's
        updates (one per log) and samples per update."""
        ctrl = self.controller
        assert isinstance(ctrl, ProportionalKL)
        updates = self._updates(args, state)
        ctrl.horizon = run_horizon(updates, self._samples_per_update(args), ctrl.clip)
        log.info("klppo: proportional horizon %.4g samples (%d updates of %d samples: beta can "
                 "move by a factor of 20 in a quarter of the run)", ctrl.horizon, updates,
                 self._samples_per_update(args))

    def _warn_at_bound(self, rec: dict[str, Any]) -> None:
        """One warning each time the controller starts pressing on a bound of beta; not for
        ``beta_min`` before the KL first reaches the target (the KL to the reference starts at
        0: a rule without a hold lowers beta to its floor while the KL ramps up, as it should;
        :meth:`_warn_not_reached` says when that lasts)."""
        bound = {1: "beta_max", -1: "beta_min"}.get(rec.get("at_bound") or 0)
        if bound == "beta_min" and not self.controller.reached:
            bound = None
        if bound is not None and bound != self._at_bound:
            value = getattr(self.controller, bound)
            warnings.warn(
                f"klppo: step {rec['step']}: the controller asks for beta beyond {bound}="
                f"{value:g} (KL {rec['kl']:.4g} against the target {rec['kl_target']:g} "
                f"{self.unit}): the target is out of reach within the bounds; widen {bound} "
                "or change the target or the learning rate (docs/algorithms.md)",
                ControllerBoundWarning, stacklevel=2)
        self._at_bound = bound

    def _warn_not_reached(self, rec: dict[str, Any], state: Any) -> None:
        """One warning when a quarter of the run has passed and the KL has never reached the
        target (a start beta too strong, a step size too small, or a target too large)."""
        ctrl = self.controller
        if self._quarter_warned or ctrl.reached or ctrl.target is None or rec.get("kl") is None:
            return
        if rec["step"] * 4 < int(state.max_steps):
            return
        self._quarter_warned = True
        warnings.warn(
            f"klppo: step {rec['step']}: the KL ({rec['kl']:.4g} {self.unit}) has not reached its "
            f"target {ctrl.target:g} in a quarter of the run (beta {ctrl.value:.4g}"
            f"{', held at its start' if rec.get('held') else ''}); a beta this strong, a "
            "learning rate this small or a target this large may never let it "
            "(docs/algorithms.md)", ControllerBoundWarning, stacklevel=2)

    def _identity(self) -> dict[str, Any]:
        return {"trainer": self.spec.name, "unit": self.unit, "estimator": self.spec.estimator,
                "settings": S.settings_of(self.controller)}

    def _restore(self, ckpt: Path, step: int) -> None:
        saved = S.read_state(ckpt, {**self._identity(), "global_step": step})
        S.load_controller(self.controller, saved, ckpt)
        self._last_update_step = _saved_step(saved, ckpt / S.STATE_FILE, step)
        log.info("klppo: controller restored from %s (beta %.6g after %d updates)", ckpt,
                 self.controller.value, self.controller.num_updates)

    def _set_beta(self, beta: float) -> None:
        setattr(self.trainer, self.spec.beta_attr, beta)
        self._beta_set = beta

    def _update(self, args, state, logs: dict[str, Any]) -> dict[str, Any]:
        spec, ctrl = self.spec, self.controller
        beta = float(getattr(self.trainer, spec.beta_attr))
        if beta != self._beta_set:
            raise RuntimeError(f"{spec.class_name}.beta was changed to {beta} outside the klppo "
                               f"controller (which set {self._beta_set})")
        logged = logs.get(spec.log_key)
        length = logs.get("completions/mean_length")
        rec: dict[str, Any] = {
            "step": state.global_step, "kl_logged": logged, "logged_unit": spec.logged_unit,
            "estimator": spec.estimator, "direction": spec.direction, "unit": self.unit,
            "penalised_unit": self.penalised_unit, "kl_penalised": None,
            "mean_length": length, "kl_target": ctrl.target, "beta": beta}
        if self.tap is not None:
            steps = max(1, state.global_step - self._last_update_step)
            rec["kl_penalised"] = self.tap.penalised(steps)
            observed = rec["kl_penalised"] if self.unit == self.penalised_unit \
                else self.tap.window(self.unit)
            rec.update(self.tap.mismatch.stats() or {})
            self.tap.reset()
            if observed is None:
                raise RuntimeError(f"step {state.global_step}: {spec.class_name} computed no "
                                   "loss with beta != 0 in this window; the controller has no KL"
                                   " to follow")
        elif logged is None:
            if spec.kl_in_every_log:
                raise RuntimeError(f"step {state.global_step}: {spec.class_name} logged no "
                                   f"{spec.log_key!r}; the controller has no KL to follow")
            # RLOO: no generation in this window, hence no new KL: beta stays
            rec.update(kl=None, beta_next=beta, relative_error=None, error_clipped=None,
                       n_steps=0, updated=0)
            self.history.append(rec)
            return rec
        else:
            observed = to_unit(float(logged), spec.logged_unit, self.unit, length)
        n = (state.global_step - self._last_update_step) * args.per_device_train_batch_size \
            * args.gradient_accumulation_steps * args.world_size
        ctrl.update(observed, n_steps=max(1, n))
        self._last_update_step = state.global_step
        self._set_beta(ctrl.value)
        info = ctrl.info
        assert info is not None
        rec.update(kl=observed, beta_next=ctrl.value, relative_error=info.relative_error,
                   error_clipped=float(info.error_clipped), n_steps=n, updated=1,
                   held=int(info.held),
                   at_bound={"beta_max": 1, "beta_min": -1}.get(info.at_bound or "", 0))
        self.history.append(rec)
        return rec


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
            ``hold_limit=N`` to release it after N updates whatever the KL), and
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


def _saved_step(saved: dict[str, Any], path: Path, step: int) -> int:
    """The saved ``last_update_step``: an integer in ``[0, step]``, else one line naming the
    file."""
    v = saved.get("last_update_step")
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= step:
        raise RuntimeError(f"{path}: last_update_step={short_repr(v)}: must be an integer in "
                           f"[0, {step}]")
    return v


def _string_defaults(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A controller built by name holds beta until the KL first reaches its target
    (``hold``; the KL to the reference starts at 0), except ``pid``, whose integral cannot go
    below 0 (its anti-windup does what the hold does for a weak start, and a hold would keep a
    strong start forever); ``proportional`` without a horizon, or
    with ``horizon="auto"``, gets one derived from the run's length and batch when training
    starts (:func:`~klppo.core.controllers.run_horizon`; 10000 until then)."""
    out = dict(options)
    if name not in ("fixed", "pid") and out.get("target") is not None:
        out.setdefault("hold", True)
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
