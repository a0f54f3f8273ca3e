"""Bounds on the sizes of the language-model commands (``klppo rlhf``, ``klppo lm pretrain``),
checked before anything is allocated or a directory is made: counts that would run without end,
and dimensions whose tensors would not fit in memory. Each problem is a
:class:`~klppo.runs.errors.ConfigError` naming the field, its value and the bound (the same form
as :mod:`klppo.rl.bounds`); docs/reliability.md lists them.
"""

from __future__ import annotations

from typing import Any

from klppo.runs.errors import ConfigError
from klppo.runs.typecheck import short_repr

__all__ = ["MAX_BATCH", "MAX_SEQ_LEN", "MAX_TOKENS", "MAX_EPOCHS", "MAX_COUNT", "MAX_VOCAB",
           "MAX_WIDTH", "MAX_LAYERS", "MAX_PARAMETERS", "MAX_THREADS", "check_rlhf",
           "check_pretrain", "gpt2_parameters"]

MAX_BATCH = 4096
"""sequences in one batch or minibatch"""
MAX_SEQ_LEN = 2048
"""tokens of one sequence (prompt, response, pretraining window, held-out window)"""
MAX_TOKENS = 2**17
"""tokens one forward pass scores at once (batch x sequence length): their logits over a
vocabulary of 50,000 are 26 GB of float32 already"""
MAX_EPOCHS = 10_000
"""passes over one batch (the defaults use 4; 10^9 ran without end)"""
MAX_COUNT = 10**7
"""iterations, optimiser steps and evaluation windows"""
MAX_VOCAB = 2**16
MAX_WIDTH = 4096
MAX_LAYERS = 64
MAX_PARAMETERS = 2**28
"""parameters of a pretrained GPT-2 (1 GiB of float32, 3 more for Adam and the gradients)"""
MAX_THREADS = 1024


def _bad(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{name}={short_repr(value)}: {why}")


def _at_most(pairs: tuple[tuple[str, Any, int], ...]) -> None:
    for name, value, top in pairs:
        if value is not None and value > top:
            raise _bad(name, value, f"must be at most {top:,}")


def check_rlhf(c: Any) -> None:
    """The sizes of a :class:`~klppo.lm.config.RLHFConfig`."""
    _at_most((("iterations", c.iterations, MAX_COUNT), ("batch_size", c.batch_size, MAX_BATCH),
              ("prompt_len", c.prompt_len, MAX_SEQ_LEN),
              ("response_len", c.response_len, MAX_SEQ_LEN),
              ("ppo_epochs", c.ppo_epochs, MAX_EPOCHS),
              ("minibatch_size", c.minibatch_size, MAX_BATCH),
              ("eval_every", c.eval_every, MAX_COUNT),
              ("eval_windows", c.eval_windows, MAX_BATCH),
              ("eval_seq_len", c.eval_seq_len, MAX_SEQ_LEN),
              ("checkpoint_every", c.checkpoint_every, MAX_COUNT),
              ("torch_threads", c.torch_threads, MAX_THREADS),
              ("monitor_patience", c.monitor_patience, MAX_COUNT),
              ("monitor_warmup", c.monitor_warmup, MAX_COUNT),
              ("ref_reset_every", c.ref_reset_every, MAX_COUNT)))
    tokens = c.batch_size * (c.prompt_len + c.response_len)
    if tokens > MAX_TOKENS:
        raise _bad("batch_size * (prompt_len + response_len)", tokens,
                   f"a batch may hold at most {MAX_TOKENS:,} tokens")


def gpt2_parameters(vocab: int, positions: int, width: int, layers: int) -> int:
    """The parameters of a GPT-2 (tied embeddings): embeddings, and per layer attention (4
    width^2) and MLP (8 width^2) weights with their biases and layer norms."""
    per_layer = 12 * width * width + 13 * width
    return vocab * width + positions * width + layers * per_layer + 2 * width


def check_pretrain(cfg: Any) -> None:
    """The sizes of a :class:`~klppo.lm.pretrain.PretrainConfig`."""
    _at_most((("steps", cfg.steps, MAX_COUNT), ("batch_size", cfg.batch_size, MAX_BATCH),
              ("seq_len", cfg.seq_len, MAX_SEQ_LEN), ("vocab_size", cfg.vocab_size, MAX_VOCAB),
              ("n_embd", cfg.n_embd, MAX_WIDTH), ("n_layer", cfg.n_layer, MAX_LAYERS),
              ("n_head", cfg.n_head, cfg.n_embd), ("torch_threads", cfg.torch_threads,
                                                   MAX_THREADS)))
    tokens = cfg.batch_size * cfg.seq_len
    if tokens > MAX_TOKENS:
        raise _bad("batch_size * seq_len", tokens, f"a step may hold at most {MAX_TOKENS:,} "
                   "tokens")
    n = gpt2_parameters(cfg.vocab_size, max(128, cfg.seq_len), cfg.n_embd, cfg.n_layer)
    if n > MAX_PARAMETERS:
        raise _bad("n_embd, n_layer, vocab_size", (cfg.n_embd, cfg.n_layer, cfg.vocab_size),
                   f"a GPT-2 of {n:,} parameters; at most {MAX_PARAMETERS:,}")
