"""Which KL the gradient of TRL GRPO's KL term descends, per setting (needs no TRL installed).

TRL's GRPO puts TRL's k3 of ``KL(policy || reference)`` per token in the loss, differentiated.
Two settings decide the importance correction (TRL 1.15-1.16 ``GRPOTrainer._compute_loss``):
``use_bias_correction_kl`` multiplies each token's k3 by the importance weight of the same
``importance_sampling_level`` (token: ``w_t``; sequence: GSPO's ``exp(mean_t log w_t)``), which is
differentiated; on the first pass over a batch the old policy is the policy (``w = 1`` with a
gradient), on later passes (``num_iterations > 1``) it is not. Each setting is one combination of
:mod:`klppo.core.kl_gradients`; :func:`grpo_settings` lists them with the verdicts claimed by
:mod:`klppo.core.kl_gradient_claims` (checked against the exact enumeration by ``klppo verify``):
over sequences (3 tokens) and for one token (the per-state KL, states held fixed).
"""

from __future__ import annotations

from dataclasses import dataclass

from klppo.core.kl_gradient_claims import claimed
from klppo.core.kl_gradients import Combination

__all__ = ["GRPOSetting", "grpo_settings", "grpo_setting"]


@dataclass(frozen=True)
class GRPOSetting:
    """One TRL GRPO setting and what its KL term's expected gradient descends."""

    importance_sampling_level: str
    use_bias_correction_kl: bool
    first_pass: bool
    """True: the first pass over a generation batch (the old policy is the policy)"""
    correction: str
    """the importance correction of :mod:`klppo.core.kl_gradients`"""
    one_token: str
    """verdict for one token (reverse / forward / neither): the KL per state"""
    sequence: str
    """verdict over sequences (3 tokens)"""

    def describe(self) -> str:
        """E.g. ``importance_sampling_level='token', use_bias_correction_kl=True, first pass``."""
        return (f"importance_sampling_level={self.importance_sampling_level!r}, "
                f"use_bias_correction_kl={self.use_bias_correction_kl}, "
                f"{'first pass' if self.first_pass else 'later passes (num_iterations > 1)'}")


def _correction(level: str, bias_correction: bool, first_pass: bool) -> tuple[str, str]:
    """(correction over sequences, correction for one token)."""
    if not bias_correction:
        return ("on_policy",) * 2 if first_pass else ("none",) * 2
    if level == "sequence":  # each token's weight holds every other token's ratio: no
        return "seq_mean_ratio_grad", ""  # per-state reading (one_token: neither)
    return "token_ratio_grad", "ratio_grad"


def grpo_setting(level: str, bias_correction: bool, first_pass: bool) -> GRPOSetting:
    """The :class:`GRPOSetting` of one choice of TRL's two options and the pass."""
    if level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level={level!r}: must be 'token' or 'sequence'")
    seq, one = _correction(level, bias_correction, first_pass)
    return GRPOSetting(level, bias_correction, first_pass, seq,
                       claimed(Combination("k3", "loss", "token", one, 1)) if one else "neither",
                       claimed(Combination("k3", "loss", "token", seq, 3)))


def grpo_settings() -> list[GRPOSetting]:
    """Every setting: both levels x with / without the bias correction x first / later pass."""
    return [grpo_setting(level, bc, first) for level in ("token", "sequence")
            for bc in (True, False) for first in (True, False)]
