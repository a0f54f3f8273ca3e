"""``klppo lm pretrain``'s settings and their checks: imports no torch, so ``--help`` is
quick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from klppo.runs.ranges import above, at_least, below, check_ranges

__all__ = ["OUTPUTS", "PretrainConfig", "validate_pretrain"]


#: what ``pretrain`` writes into ``out`` (Hugging Face's model and tokenizer files, the result)
OUTPUTS = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
           "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
           "pretrain.json")


@dataclass
class PretrainConfig:
    out: str = "runs/lm/base"
    """directory for the model and tokenizer (Hugging Face format)"""
    steps: int = field(default=1200, metadata=at_least(1))
    """optimiser steps (about 2.6 CPU-minutes as shipped: held-out perplexity about 58)"""
    batch_size: int = field(default=16, metadata=at_least(1))
    """sequences per step"""
    seq_len: int = field(default=64, metadata=at_least(1))
    """tokens per sequence"""
    lr: float = field(default=3e-3, metadata=above(0))
    """peak AdamW learning rate (linear warm-up over 100 steps, then linear decay)"""
    vocab_size: int = field(default=2048, metadata=at_least(
        257, text="must be an integer >= 257 (256 bytes + the end-of-text token)"))
    """BPE vocabulary size"""
    n_embd: int = field(default=128, metadata=at_least(1))
    """GPT-2 width (a multiple of n_head)"""
    n_layer: int = field(default=4, metadata=at_least(1))
    """GPT-2 layers"""
    n_head: int = field(default=4, metadata=at_least(1))
    """attention heads"""
    seed: int = field(default=0, metadata=below(2**32, text="must be an integer in [0, 2**32)"))
    """seed of the initialisation and the batch order"""
    torch_threads: int = field(default=1, metadata=at_least(1))
    """torch threads"""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """where the model trains (auto: cuda when available)"""


def validate_pretrain(cfg: PretrainConfig) -> PretrainConfig:
    """Check every field (type, range) and that ``out`` can be written, before any work;
    ``ConfigError`` names the first bad field and its value."""
    from klppo.lm.config import ConfigError
    from klppo.runs.configfile import field_hints
    from klppo.runs.paths import check_writable
    from klppo.runs.typecheck import TypeCheckError, check_value

    for name, ann in field_hints(PretrainConfig).items():
        try:
            check_value(name, getattr(cfg, name), ann)
        except TypeCheckError as e:
            raise ConfigError(str(e)) from None
    check_ranges(cfg)
    from klppo.lm.bounds import check_pretrain

    check_pretrain(cfg)
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"n_embd={cfg.n_embd!r}: must be a multiple of n_head={cfg.n_head}")
    if not cfg.out.strip():
        raise ConfigError(f"out={cfg.out!r}: names no path")
    from klppo.runs.owned import owned_reason

    reason = owned_reason(cfg.out, OUTPUTS, "out")
    if reason is not None:
        raise ConfigError(reason)
    from klppo.runs.device import resolve_device

    try:
        check_writable(cfg.out)
        resolve_device(cfg.device)
    except (OSError, ValueError) as e:
        raise ConfigError(str(e)) from None
    _check_empty(cfg.out)
    return cfg


def _check_empty(out: str) -> None:
    """A pretrained model is never replaced (a run may read it as its ``--model``, and its
    resume checks the model is the one it started from): ``out`` must be new or empty."""
    from pathlib import Path

    from klppo.lm.config import ConfigError

    p = Path(out)
    names = sorted(c.name for c in p.iterdir()) if p.is_dir() else []
    if names:
        raise ConfigError(f"out={out!r}: is not empty ({len(names)} entries, e.g. "
                          f"{names[0][:60]!r}); a pretrained model is never replaced: choose a "
                          f"new or empty directory (or delete this one first)")
