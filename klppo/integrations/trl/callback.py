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

from klppo.core.controller_base import BoundWatch
from klppo.core.controllers import (
    KLController,
    ProportionalKL,
    run_horizon,
)
from klppo.integrations.trl import state as S
from klppo.integrations.trl.grpo_kl import KLTap
from klppo.integrations.trl.trainers import (
    TrainerKL,
    penalised_unit,
    to_unit,
)
from klppo.runs.typecheck import short_repr

log = logging.getLogger(__name__)

__all__ = ["KLControlCallback", "ControllerBoundWarning", "PREFIX"]


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
        self._bounds = BoundWatch()
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
        self._warn_at_bound(rec, args, state)
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

    def _warn_at_bound(self, rec: dict[str, Any], args: Any, state: Any) -> None:
        """One warning per bound of beta, when the controller has pressed on it for a tenth of
        the run's updates in a row (at least 3): a noisy KL that dips under the target for an
        update or two is no sign the target is out of reach. Not for ``beta_min`` before the KL
        first reaches the target (the KL to the reference starts at 0: a rule without a hold
        lowers beta to its floor while the KL ramps up, as it should; :meth:`_warn_not_reached`
        says when that lasts)."""
        bound = {1: "beta_max", -1: "beta_min"}.get(rec.get("at_bound") or 0)
        if bound == "beta_min" and not self.controller.reached:
            bound = None
        need = max(3, self._updates(args, state) // 10)
        if self._bounds.see(bound, rec["step"], need) and bound is not None:
            value = getattr(self.controller, bound)
            warnings.warn(
                f"klppo: step {rec['step']}: the controller has asked for beta beyond {bound}="
                f"{value:g} for {need} updates in a row, since step {self._bounds.since} (KL "
                f"{rec['kl']:.4g} against the target {rec['kl_target']:g} {self.unit}): "
                f"within its bounds beta cannot move the KL to the target meanwhile; if this "
                f"lasts, widen {bound} or change the target or the learning rate "
                "(docs/algorithms.md)", ControllerBoundWarning, stacklevel=2)

    def _warn_not_reached(self, rec: dict[str, Any], state: Any) -> None:
        """One warning when a quarter of the run has passed and the KL has never reached the
        target (a start beta too strong, a step size too small, or a target too large)."""
        ctrl = self.controller
        if (self._quarter_warned or ctrl.reached or ctrl.target is None or ctrl.name == "fixed"
                or rec.get("kl") is None):
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


def _saved_step(saved: dict[str, Any], path: Path, step: int) -> int:
    """The saved ``last_update_step``: an integer in ``[0, step]``, else one line naming the
    file."""
    v = saved.get("last_update_step")
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= step:
        raise RuntimeError(f"{path}: last_update_step={short_repr(v)}: must be an integer in "
                           f"[0, {step}]")
    return v
