"""What an RLHF experiment settles before its first iteration, and the KL it feeds its controller:
the corpus' token ids, the lengths against the model's positions, the log lines that say what
surprising choices mean, and the KL in the run's unit."""

from __future__ import annotations

import hashlib
import logging
import warnings
from typing import Any

import numpy as np
import torch

from klppo.core.kl import NOT_KL, per_sequence_sum, per_token_mean
from klppo.core.kl_gradient_claims import KLGradientWarning
from klppo.lm.config import ConfigError, RLHFConfig, kl_gradient_warning
from klppo.lm.presets import RLHF_PRESETS
from klppo.lm.pretrain import encode

log = logging.getLogger("klppo.lm.experiment")

__all__ = ["corpus_ids", "check_lengths", "KL_UNITS", "measure_kl", "say_what_the_choices_mean"]


_CORPUS_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def corpus_ids(tok: Any) -> tuple[np.ndarray, np.ndarray]:
    """Train and held-out token ids of the corpus (read-only; the last two tokenizers' results
    are cached, since the encoding takes seconds and a process may run several experiments)."""
    backend = getattr(tok, "backend_tokenizer", None)
    key = hashlib.sha256(backend.to_str().encode()).hexdigest() if backend is not None else None
    if key in _CORPUS_CACHE:
        return _CORPUS_CACHE[key]
    from klppo.lm.corpus import split_corpus

    split = split_corpus()
    train, held = encode(tok, split.train), encode(tok, split.held_out)
    train.flags.writeable = held.flags.writeable = False
    if key is not None:
        while len(_CORPUS_CACHE) >= 2:
            _CORPUS_CACHE.pop(next(iter(_CORPUS_CACHE)))
        _CORPUS_CACHE[key] = (train, held)
    return train, held


def check_lengths(cfg: RLHFConfig, lm: Any) -> None:
    n = getattr(lm.config, "n_positions", None) or getattr(lm.config,
                                                          "max_position_embeddings", None)
    if n is None:
        return
    if cfg.prompt_len + cfg.response_len > n:
        raise ConfigError(f"response_len={cfg.response_len!r}: prompt_len + response_len = "
                          f"{cfg.prompt_len + cfg.response_len} exceeds the model's {n} "
                          f"positions")
    if cfg.eval_seq_len > n:
        raise ConfigError(f"eval_seq_len={cfg.eval_seq_len!r}: exceeds the model's {n} positions")


#: the learning rate from which a named pretrained model is warned about: its KL ran away at
#: 1e-4 whatever beta was (docs/algorithms.md, "Can beta hold the KL of a pretrained LM?")
PRETRAINED_LR_LIMIT = 1e-4

#: the unit of each kl_unit, for messages
KL_UNITS = {"per_sequence_sum": "nats per sequence", "per_token_mean": "nats per token",
            "per_token_mean_all": "nats per position (padding included)"}


def measure_kl(kl: torch.Tensor, mask: torch.Tensor, unit: str) -> float:
    """The controller's KL in ``unit``: per-sequence sum (mean over sequences), per-token mean
    over response tokens, or the mean over every position (padding counts as 0; trlx logs its
    square root)."""
    if unit == "per_sequence_sum":
        return float(per_sequence_sum(kl, mask).mean())
    if unit == "per_token_mean_all":
        return float(torch.where(mask, kl, torch.zeros((), dtype=kl.dtype)).mean())
    return float(per_token_mean(kl, mask))


def say_what_the_choices_mean(cfg: RLHFConfig) -> None:
    """Log the choices that do something users may not expect; warn (once, as a
    :class:`KLGradientWarning`) when the KL penalty's gradient is not that of
    KL(policy || reference)."""
    if cfg.controller == "proportional" and cfg.target is None:
        log.warning("controller proportional with no target: a fixed beta %g (trlx's "
                    "semantics)", cfg.beta)
    if cfg.model in RLHF_PRESETS and cfg.lr >= PRETRAINED_LR_LIMIT:
        log.warning("lr=%g on model %s: at lr 1e-4 the KL of SmolLM2-135M grew about 1 nat "
                    "per iteration whatever beta was (docs/results/rlhf-smollm2); --preset %s "
                    "(lr 1e-5, the PID rule) held a target of 3 nats on 3 seeds (%s)",
                    cfg.lr, cfg.model, cfg.model, RLHF_PRESETS[cfg.model][1])
    if cfg.kl_estimator in NOT_KL:
        log.warning("kl_estimator %s does not estimate KL(policy || reference) (see "
                    "klppo.core.kl); chosen to reproduce a peer", cfg.kl_estimator)
    biased = kl_gradient_warning(cfg)
    if biased is not None:
        warnings.warn(biased, KLGradientWarning, stacklevel=3)
