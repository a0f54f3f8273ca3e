"""GRPO's entropy coefficient driven to a target entropy by a klppo rule, inside TRL.

TRL 1.16's ``GRPOTrainer`` subtracts ``self.entropy_coef * H`` from the loss (``H`` the mean
token entropy of the loss call) when it was built with ``entropy_coef != 0``, and logs ``entropy``
(the token mean, averaged over the logging window). Its own ``use_adaptive_entropy`` moves the
coefficient by a fixed step; :func:`attach_entropy` instead feeds the logged entropy to any
klppo rule (:mod:`klppo.core.entropy_control`) after every log and writes the new coefficient
into ``trainer.entropy_coef``, saving the rule's state beside each checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from klppo.core.entropy_control import EntropyControl, make_entropy_control
from klppo.integrations import controller_state as S
from klppo.integrations.trl.trainers import TRLIntegrationError

__all__ = ["EntropyControlCallback", "attach_entropy", "ENTROPY_STATE_FILE"]

ENTROPY_STATE_FILE = "klppo_entropy_controller.json"
_FORMAT = "klppo.integrations.trl.entropy/1"
#: the lines of ``GRPOTrainer._compute_loss`` (whitespace removed) this callback relies on
_INTERNALS = ("apply_coef=self.entropy_coef",
              "loss=loss-apply_coef*entropy_loss",
              'self._metrics[mode]["entropy"].append(global_masked_mean(entropies))')


class EntropyControlCallback(TrainerCallback):
    """Feeds ``control`` the entropy the trainer logged and writes the coefficient into
    ``trainer.entropy_coef``; ``history`` holds one record per log."""

    def __init__(self, trainer: Any, control: EntropyControl) -> None:
        self.trainer, self.control = trainer, control
        self.history: list[dict[str, float]] = []
        self._last_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            saved = S.read_state(ckpt, self._identity(state.global_step), _FORMAT,
                                 ENTROPY_STATE_FILE)
            S.load_controller(self.control, saved, ckpt, ENTROPY_STATE_FILE)
            self._last_step = int(saved["last_update_step"])
        self.trainer.entropy_coef = self.control.value

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or "entropy" not in logs:
            return
        used = float(self.trainer.entropy_coef)
        n = (state.global_step - self._last_step) * args.per_device_train_batch_size \
            * args.gradient_accumulation_steps * args.world_size
        self.trainer.entropy_coef = self.control.update(float(logs["entropy"]), n_steps=max(1, n))
        self._last_step = state.global_step
        rec = {"step": state.global_step, "entropy": float(logs["entropy"]),
               "entropy_coef": used, "entropy_coef_next": self.trainer.entropy_coef}
        self.history.append(rec)
        numbers = {"klppo/entropy_coef": used, "klppo/entropy_coef_next": self.trainer.entropy_coef}
        logs.update(numbers)  # the reporters after this callback see them
        last = state.log_history[-1] if state.log_history else None
        if last is not None and last.get("step") == state.global_step and \
                last.get("loss") == logs["loss"]:
            last.update(numbers)  # trainer_state.json (saved with the checkpoint) keeps them

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            S.write_state(ckpt, {**self._identity(state.global_step),
                                 "last_update_step": self._last_step,
                                 "controller": self.control.state_dict()}, _FORMAT,
                          ENTROPY_STATE_FILE)

    def _identity(self, step: int) -> dict[str, Any]:
        return {"settings": S.settings_of(self.control.rule), "global_step": step}


def attach_entropy(trainer: Any, rule: str = "proportional", *, target: float,
                   coef_min: float = 0.0, coef_max: float = 1.0,
                   **options: Any) -> EntropyControlCallback:
    """Drive a TRL ``GRPOTrainer``'s ``entropy_coef`` to the token-mean entropy ``target``
    (nats) with klppo rule ``rule`` (``options``: its settings), starting at the trainer's
    coefficient (which must be > 0 at construction: with 0 TRL computes no entropy bonus).
    Refused (:class:`TRLIntegrationError`, one line): another trainer, TRL's own
    ``use_adaptive_entropy``, a coefficient of 0, a TRL whose loss lacks the lines read."""
    import inspect

    import trl

    if not isinstance(trainer, trl.GRPOTrainer):
        raise TRLIntegrationError(f"trainer={type(trainer).__name__}: the entropy bonus is "
                                  "GRPOTrainer's (RLOOTrainer has none)")
    source = "".join(inspect.getsource(trl.GRPOTrainer._compute_loss).split())
    missing = [line for line in _INTERNALS if line not in source]
    if missing:
        raise TRLIntegrationError(f"trl=={trl.__version__}: GRPOTrainer._compute_loss lacks "
                                  f"{missing[0]!r}, which the entropy control relies on")
    quantile = float(getattr(trainer.args, "top_entropy_quantile", 1.0))
    if quantile < 1.0:
        raise TRLIntegrationError(
            f"top_entropy_quantile={quantile}: TRL's entropy bonus then acts on the "
            "highest-entropy tokens only, while the entropy it logs (and the controller would "
            "read) is over every token; set it to 1.0 or leave the coefficient fixed")
    if trainer.use_adaptive_entropy:
        raise TRLIntegrationError("use_adaptive_entropy=True: TRL's own entropy rule would move "
                                  "the same coefficient; set it to False")
    coef = float(trainer.entropy_coef)
    if not coef > 0:
        raise TRLIntegrationError(f"GRPOTrainer.entropy_coef={coef}: with 0 at construction TRL "
                                  "adds no entropy bonus; build the trainer with the starting "
                                  "coefficient (> 0)")
    try:
        control = make_entropy_control(rule, coef, target, coef_min, coef_max, **options)
    except (TypeError, ValueError) as e:
        raise TRLIntegrationError(f"rule={rule!r}: {e}") from None
    cb = EntropyControlCallback(trainer, control)
    callbacks = trainer.callback_handler.callbacks
    first = next((i + 1 for i, c in enumerate(callbacks)
                  if type(c).__name__ == "DefaultFlowCallback"), 0)
    callbacks.insert(first, cb)
    return cb
