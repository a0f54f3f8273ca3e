"""The sampler / trainer mismatch of GRPO's rollouts, where TRL exposes it (vLLM generation).

With ``use_vllm=True`` and ``vllm_importance_sampling_correction`` (TRL 1.16), each batch holds
``sampling_per_token_logps`` (the log-probabilities vLLM sampled the tokens with, ``mu``),
``old_per_token_logps`` (the trainer's, ``pi_old``) and ``importance_sampling_ratio`` (TRL's
correction weight, after its truncation or masking). TRL logs the mean and largest
``|log pi_old - log mu|`` and the weight's min, mean and max; :class:`MismatchWindow` gives the
full set of :func:`klppo.core.mismatch.mismatch_stats` (k1, k2, k3 of KL(mu || pi_old) in nats
per token, chi-square per token and per response, the perplexity ratio, the weights' effective
sample size) over every completion token of a log window, all processes gathered. Tokens vLLM
could not score (NaN) are left out, as TRL leaves them out.
"""

from __future__ import annotations

from typing import Any

import torch

from klppo.core.mismatch import mismatch_stats

__all__ = ["MismatchWindow"]


class MismatchWindow:
    """The mismatch of the training batches seen since the last :meth:`reset`."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def reset(self) -> None:
        self.parts = []

    def add(self, inputs: dict[str, Any]) -> None:
        """Keep one loss call's batch, when it holds both the sampler's and the trainer's
        log-probabilities (nothing otherwise)."""
        mu, old = inputs.get("sampling_per_token_logps"), inputs.get("old_per_token_logps")
        if mu is None or old is None:
            return
        mask = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask = mask & inputs["tool_mask"].bool()
        log_ratio = (old - mu).detach().double()
        mask = mask & ~torch.isnan(log_ratio)
        w = inputs.get("importance_sampling_ratio")
        weights = torch.ones_like(log_ratio) if w is None else \
            w.detach().double().expand_as(log_ratio)  # [B, 1] at sequence level
        self.parts.append((log_ratio, mask, torch.nan_to_num(weights)))

    def stats(self) -> dict[str, float] | None:
        """:func:`~klppo.core.mismatch.mismatch_stats` over the window's tokens on every
        process (None: no batch in the window held both log-probabilities)."""
        if not self.parts:
            return None
        width = max(p[0].shape[1] for p in self.parts)
        cols = [torch.cat([_pad(p[i], width) for p in self.parts]) for i in range(3)]
        acc = self.accelerator
        if acc.num_processes > 1:
            cols = [acc.gather(acc.pad_across_processes(c.contiguous(), dim=1)) for c in cols]
        return mismatch_stats(cols[0], cols[1].bool(), cols[2])


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` ([B, T]) padded with zeros (False) to ``width`` columns."""
    return torch.nn.functional.pad(t.to(torch.float64), (0, width - t.shape[1]))
