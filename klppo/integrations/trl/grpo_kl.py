"""GRPO's KL term as TRL's loss computes it, per ``loss_type``, read from every loss call.

TRL's ``GRPOTrainer._compute_loss`` adds ``beta * per_token_kl`` to each token's loss and then
reduces the tokens with the ``loss_type``'s normaliser, so the unit that beta multiplies is the
loss type's (:data:`LOSS_UNITS`); TRL logs one KL for all of them, the token mean. The
:class:`KLTap` sees each loss call's per-token KL (the policy's log-probabilities of that call,
the reference's and the old policy's from the batch, TRL's k3 and, with
``use_bias_correction_kl``, its per-token importance ratio) and keeps two things:

* **the KL term itself** (:meth:`KLTap.penalised`): each call's KL reduced exactly as TRL reduces
  it (the loss type's normaliser, the accumulation steps, ``num_items_in_batch`` over processes
  and ``steps_per_generation``, the mean over processes that data parallelism takes), summed
  over the window and divided by its optimiser steps: per optimiser step, the number beta
  multiplies in the loss whose gradient is taken, whatever the windowing;
* **pooled sums** (:meth:`KLTap.window`), from which the window's KL follows in any unit of
  :data:`UNIT_MEANINGS` over all the window's tokens (nothing converted with a mean length).

In TRL's default windowing (one process or several, ``steps_per_generation`` equal to
``gradient_accumulation_steps``) the two agree for the penalised unit; outside it they can
differ (``bnpo`` averages per-micro-batch token means, ``dapo`` divides by the generation
batch's token count), and the controller is fed the first when its unit is the penalised one.

Every call is checked against TRL: the token mean of the tap's per-token KL must be the value
TRL logged for that call, else training stops (TRL's internals are not what this module reads).
"""

from __future__ import annotations

from typing import Any

import torch

from klppo.core.kl import per_sequence_mean, per_sequence_sum, sampled_kl
from klppo.integrations.trl.mismatch import MismatchWindow

__all__ = ["LOSS_UNITS", "UNIT_MEANINGS", "KLTap", "unit_value"]

#: per GRPO ``loss_type``: the unit of the KL that beta multiplies in TRL's loss
LOSS_UNITS: dict[str, str] = {
    "grpo": "per_sequence_mean",     # mean over sequences of each one's token mean
    "sapo": "per_sequence_mean",
    "bnpo": "per_token_mean",        # token mean of the micro-batch
    "dapo": "per_token_mean",        # token mean of the generation batch (num_items_in_batch)
    "cispo": "per_token_mean",
    "vespo": "per_token_mean",
    "luspo": "per_sequence_sum",     # mean over sequences of each one's sum
    "dr_grpo": "per_padded_token",   # sum over the batch / (B * max_completion_length)
}
#: what each unit the tap serves means
UNIT_MEANINGS: dict[str, str] = {
    "per_token_mean": "nats per token: sum over the tokens / number of tokens",
    "per_sequence_mean": "nats per token, each sequence weighted equally: the mean over "
                         "sequences of each sequence's token mean",
    "per_sequence_sum": "nats per sequence: the mean over sequences of each sequence's sum",
    "per_padded_token": "nats per padded token: sum over the tokens / (sequences x "
                        "max_completion_length), Dr. GRPO's constant normaliser",
}
#: the sums the tap keeps: KL over tokens, tokens, per-sequence means, per-sequence sums,
#: sequences, and TRL's KL term (summed over the loss calls)
_FIELDS = ("kl_sum", "tokens", "seq_mean_sum", "seq_sum_sum", "sequences", "term")


def unit_value(sums: dict[str, float], unit: str, max_length: int) -> float:
    """The KL in ``unit`` from the pooled sums of a window (see :data:`UNIT_MEANINGS`)."""
    if unit == "per_token_mean":
        return sums["kl_sum"] / max(sums["tokens"], 1.0)
    n = max(sums["sequences"], 1.0)
    if unit == "per_sequence_mean":
        return sums["seq_mean_sum"] / n
    if unit == "per_sequence_sum":
        return sums["seq_sum_sum"] / n
    if unit == "per_padded_token":
        return sums["kl_sum"] / (n * max_length)
    raise ValueError(f"unit={unit!r}: must be one of {', '.join(UNIT_MEANINGS)}")


class KLTap:
    """Wraps (on the trainer object only, not its class) the two methods of a GRPOTrainer that
    see the per-token log-probabilities of a loss call, and pools the call's KL sums."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._logps: torch.Tensor | None = None
        self.calls = 0
        self.mismatch = MismatchWindow(trainer.accelerator)
        self.reset()
        self._logps_fn = trainer._get_per_token_logps_and_entropies
        self._loss_fn = trainer._compute_loss
        trainer._get_per_token_logps_and_entropies = self._capture_logps
        trainer._compute_loss = self._compute_loss

    def reset(self) -> None:
        """Start a new window."""
        self.sums = dict.fromkeys(_FIELDS, 0.0)
        self.mismatch.reset()

    def window(self, unit: str) -> float | None:
        """The window's KL in ``unit`` over all its tokens pooled (None: no loss call since the
        last reset)."""
        if self.sums["sequences"] == 0:
            return None
        return unit_value(self.sums, unit, int(self.trainer.args.max_completion_length))

    def penalised(self, optimizer_steps: int) -> float | None:
        """The KL term of TRL's loss (what beta multiplies), summed over the window's loss calls
        and divided by its ``optimizer_steps`` (None: no loss call since the last reset)."""
        if self.sums["sequences"] == 0:
            return None
        if optimizer_steps < 1:
            raise ValueError(f"optimizer_steps={optimizer_steps!r}: must be >= 1")
        return self.sums["term"] / optimizer_steps

    # ------------------------------------------------------------------ the wrappers
    def _capture_logps(self, *args: Any, **kwargs: Any) -> Any:
        out = self._logps_fn(*args, **kwargs)
        if kwargs.get("compute_entropy"):  # only the loss's call asks for entropies
            self._logps = out[0].detach()
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        self._logps = None
        loss = self._loss_fn(model, inputs)
        if self.trainer.model.training:
            self.mismatch.add(inputs)
            if self.trainer.beta != 0.0:
                self._add(inputs)
        return loss

    def _add(self, inputs: dict[str, Any]) -> None:
        if self._logps is None:
            raise RuntimeError("GRPOTrainer._compute_loss computed no per-token log-probabilities"
                               " through _get_per_token_logps_and_entropies(compute_entropy="
                               "True): TRL's internals are not what klppo reads")
        kl, mask = self.per_token_kl(self._logps, inputs)
        m = mask.to(kl.dtype)
        term = self.loss_term(kl.detach().double(), mask, inputs)
        local = torch.stack([(kl * m).sum().double(), m.sum().double(),
                             per_sequence_mean(kl, mask).sum().double(),
                             per_sequence_sum(kl, mask).sum().double(),
                             torch.tensor(float(kl.shape[0]), dtype=torch.float64,
                                          device=kl.device), term.to(kl.device)])
        total = self.trainer.accelerator.reduce(local, reduction="sum").tolist()
        total[5] /= self.trainer.accelerator.num_processes  # data parallelism's mean
        self._check_against_trl(total[0] / max(total[1], 1.0))
        for k, v in zip(_FIELDS, total):
            self.sums[k] += v
        self.calls += 1

    def per_token_kl(self, logps: torch.Tensor, inputs: dict[str, Any]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B, T] per-token KL as TRL's loss has it, [B, T] bool mask)``: k3 of the policy
        against the reference (klppo's estimator), times the per-token importance ratio to the
        old policy when ``use_bias_correction_kl`` (token level: sequence level is refused at
        attach)."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        kl = sampled_kl(logps, inputs["ref_per_token_logps"], "k3")
        if self.trainer.args.use_bias_correction_kl:
            old = inputs.get("old_per_token_logps")
            if old is not None:
                kl = kl * torch.exp(logps - old)
        return kl, mask.bool()

    def loss_term(self, kl: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any]
                  ) -> torch.Tensor:
        """This process's KL term of one training loss call, reduced as TRL 1.16's
        ``_compute_loss`` reduces ``beta * per_token_kl`` (divided by beta)."""
        t, args = self.trainer, self.trainer.args
        m = mask.to(kl.dtype)
        ga = float(t.current_gradient_accumulation_steps)
        loss_type = args.loss_type
        if loss_type in ("grpo", "sapo"):
            value = per_sequence_mean(kl, mask).mean()
        elif loss_type == "bnpo":
            value = (kl * m).sum() / m.sum().clamp(min=1.0)
        elif loss_type == "dr_grpo":
            value = (kl * m).sum() / (kl.shape[0] * int(args.max_completion_length))
        elif loss_type == "luspo":
            value = per_sequence_sum(kl, mask).mean()
        elif loss_type in ("dapo", "cispo", "vespo"):
            n = inputs["num_items_in_batch"].double().clamp(min=1.0).cpu()
            per_process = n / t.accelerator.num_processes
            return ((kl * m).sum().cpu() / (per_process * ga / args.steps_per_generation))
        else:
            raise RuntimeError(f"loss_type={loss_type!r}: klppo does not know how TRL reduces it")
        return (value / ga).cpu()

    def _check_against_trl(self, token_mean: float) -> None:
        logged = self.trainer._metrics["train"]["kl"]
        if not logged:
            raise RuntimeError("GRPOTrainer logged no KL for a loss call with beta != 0: TRL's "
                               "internals are not what klppo reads")
        trl_value = float(logged[-1])
        # TRL computes k3 as exp(x) - x - 1 in float32: near 0 it cancels to about 3e-7 per
        # token (klppo's expm1 does not), hence the absolute floor
        if abs(trl_value - token_mean) > max(1e-5 * abs(trl_value), 1e-6):
            raise RuntimeError(
                f"GRPOTrainer logged kl={trl_value!r} for a loss call, klppo's reading of the "
                f"same call gives {token_mean!r}: TRL computes its KL differently from what "
                "klppo.integrations.trl reads; the controller cannot be fed the KL beta "
                "multiplies")
