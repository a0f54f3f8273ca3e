"""Sampling with a KV cache, and log-probabilities of given tokens under a model."""

from __future__ import annotations

import torch

__all__ = ["generate", "token_logprobs", "response_mask"]


@torch.no_grad()
def generate(model, prompts: torch.Tensor, response_len: int,
             generator: torch.Generator | None = None,
             temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``response_len`` tokens after each prompt, reusing the KV cache.

    Args:
        model: a Hugging Face causal LM (anything returning ``.logits`` and its KV cache as
            ``.cache``, transformers 5.2x, or ``.past_key_values``, earlier).
        prompts: ``[B, P]`` token ids (same length, no padding).
        response_len: tokens to sample per prompt.
        generator: torch generator for the draws (reproducible sampling).
        temperature: softmax temperature (1 samples from the model itself).

    Returns:
        ``(responses [B, R], logp [B, R])``: sampled ids and their log-probabilities under the
        sampling distribution (at ``temperature``).
    """
    if response_len < 1:
        raise ValueError(f"response_len must be >= 1, got response_len={response_len!r}")
    out = model(input_ids=prompts, use_cache=True)
    name = "cache" if "cache" in getattr(out, "__dataclass_fields__", {}) else "past_key_values"
    past = getattr(out, name)
    logits = out.logits[:, -1]
    tokens, logps = [], []
    for t in range(response_len):
        logp_all = torch.log_softmax(logits.float() / temperature, -1)
        nxt = torch.multinomial(logp_all.exp(), 1, generator=generator)
        tokens.append(nxt)
        logps.append(logp_all.gather(-1, nxt))
        if t + 1 < response_len:
            out = model(input_ids=nxt, use_cache=True, **{name: past})
            past = getattr(out, name)
            logits = out.logits[:, -1]
    return torch.cat(tokens, 1), torch.cat(logps, 1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log p(tokens)`` from the logits that predict them: ``[B, L, V], [B, L] -> [B, L]``."""
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def response_mask(responses: torch.Tensor, eos_id: int | None, stop_at_eos: bool) -> torch.Tensor:
    """``[B, R]`` bool: True on real response tokens. With ``stop_at_eos``, tokens after the
    first end-of-text token are padding (the EOS itself counts as a real token)."""
    mask = torch.ones_like(responses, dtype=torch.bool)
    if not stop_at_eos or eos_id is None:
        return mask
    is_eos = responses == eos_id
    after = torch.cumsum(is_eos.int(), 1) - is_eos.int() > 0
    return ~after
