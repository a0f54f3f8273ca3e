"""GRPO's KL term as TRL's loss computes it, per ``loss_type``, read from every loss call.

TRL's ``GRPOTrainer._compute_loss`` adds ``beta * per_token_kl`` to each token's loss and then
reduces the tokens with the ``loss_type``'s normaliser, so the unit that beta multiplies is the
loss type's (:data:`LOSS_UNITS`); TRL logs one KL for all of them, the token mean. The
:class:`KLTap` sees each loss call's per-token KL (the policy's log-probabilities of that call,
the reference's and the old policy's from the batch, TRL's k3 and, with
``use_bias_correction_kl``, its per-token importance ratio) and keeps the sums from which the
window's KL follows **exactly** in every unit: nothing is converted with a mean length.

Every call is checked against TRL: the token mean of the tap's per-token KL must be the value
TRL logged for that call, else training stops (TRL's internals are not what this module reads).
"""

from __future__ import annotations

from typing import Any

import torch

from klppo.core.kl import per_sequence_mean, per_sequence_sum, sampled_kl

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
#: sequences
_FIELDS = ("kl_sum", "tokens", "seq_mean_sum", "seq_sum_sum", "sequences")


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
        self.reset()
        self._logps_fn = trainer._get_per_token_logps_and_entropies
        self._loss_fn = trainer._compute_loss
        trainer._get_per_token_logps_and_entropies = self._capture_logps
        trainer._compute_loss = self._compute_loss

    def reset(self) -> None:
        """Start a new window."""
        self.sums = dict.fromkeys(_FIELDS, 0.0)

    def window(self, unit: str) -> float | None:
        """The window's KL in ``unit`` (None: no loss call since the last reset)."""
        if self.sums["sequences"] == 0:
            return None
        return unit_value(self.sums, unit, int(self.trainer.args.max_completion_length))

    # ------------------------------------------------------------------ the wrappers
    def _capture_logps(self, *args: Any, **kwargs: Any) -> Any:
        out = self._logps_fn(*args, **kwargs)
        if kwargs.get("compute_entropy"):  # only the loss's call asks for entropies
            self._logps = out[0].detach()
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        self._logps = None
        loss = self._loss_fn(model, inputs)
        if self.trainer.model.training and self.trainer.beta != 0.0:
            self._add(inputs)
        return loss

    def _add(self, inputs: dict[str, Any]) -> None:
        if self._logps is None:
            raise RuntimeError("GRPOTrainer._compute_loss computed no per-token log-probabilities"
                               " through _get_per_token_logps_and_entropies(compute_entropy="
                               "True): TRL's internals are not what klppo reads")
        kl, mask = self.per_token_kl(self._logps, inputs)
        m = mask.to(kl.dtype)
        local = torch.stack([(kl * m).sum(), m.sum(), per_sequence_mean(kl, mask).sum(),
                             per_sequence_sum(kl, mask).sum(),
                             torch.tensor(float(kl.shape[0]), dtype=kl.dtype, device=kl.device)])
        total = self.trainer.accelerator.reduce(local.double(), reduction="sum").tolist()
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

    def _check_against_trl(self, token_mean: float) -> None:
        logged = self.trainer._metrics["train"]["kl"]
        if not logged:
            raise RuntimeError("GRPOTrainer logged no KL for a loss call with beta != 0: TRL's "
                               "internals are not what klppo reads")
        trl_value = float(logged[-1])
        if abs(trl_value - token_mean) > 1e-5 * max(abs(trl_value), 1e-3):
            raise RuntimeError(
                f"GRPOTrainer logged kl={trl_value!r} for a loss call, klppo's reading of the "
                f"same call gives {token_mean!r}: TRL computes its KL differently from what "
                "klppo.integrations.trl reads; the controller cannot be fed the KL beta "
                "multiplies")
