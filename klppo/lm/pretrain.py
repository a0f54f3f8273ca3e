"""``klppo lm pretrain``: the tokenizer and the reference LM, trained on the train split."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.lm.corpus import split_corpus
from klppo.lm.model import small_gpt2, train_tokenizer
from klppo.lm.pretrain_config import PretrainConfig, validate_pretrain
from klppo.runs.device import resolve_device

log = logging.getLogger(__name__)

__all__ = ["PretrainConfig", "validate_pretrain", "pretrain", "perplexity", "encode"]


def encode(tok, text: str) -> np.ndarray:
    """Token ids of a long text (encoded in line-aligned chunks), int64."""
    ids: list[int] = []
    chunk = 200_000
    start = 0
    while start < len(text):
        end = text.find("\n", min(start + chunk, len(text)))
        end = len(text) if end < 0 else end + 1
        ids.extend(tok(text[start:end])["input_ids"])
        start = end
    return np.asarray(ids, np.int64)


@torch.no_grad()
def perplexity(model, ids: np.ndarray, seq_len: int = 128, max_windows: int = 200) -> float:
    """exp(mean next-token NLL) over non-overlapping windows of held-out tokens (at most
    ``max_windows``, evenly spaced, so the estimate is deterministic)."""
    n = (len(ids) - 1) // seq_len
    picks = np.linspace(0, n - 1, min(n, max_windows)).astype(int)
    device = next(model.parameters()).device
    x = torch.from_numpy(np.stack([ids[i * seq_len:(i + 1) * seq_len + 1] for i in picks]))
    x = x.to(device)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(x), 32):
        b = x[i:i + 32]
        logits = model(input_ids=b[:, :-1]).logits
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                b[:, 1:].reshape(-1), reduction="sum")
        total += float(nll)
        count += b[:, 1:].numel()
    model.train(was_training)
    return math.exp(total / count)


def pretrain(cfg: PretrainConfig,
             on_step: Callable[[dict[str, Any]], None] | None = None) -> dict:
    """Train tokenizer and LM; save both to ``cfg.out``; return the measured numbers.

    ``on_step`` (if given) is called after every optimiser step with ``{"step", "steps",
    "loss", "lr"}`` (step counts from 1; loss in nats per token); the library prints nothing.
    Bad input raises ``ConfigError`` before any work; ``cfg.out`` is created only to save."""
    validate_pretrain(cfg)
    torch.set_num_threads(cfg.torch_threads)
    out = Path(cfg.out)
    split = split_corpus()
    t0 = time.perf_counter()
    tok = train_tokenizer(split.train, cfg.vocab_size)
    train_ids, held_ids = encode(tok, split.train), encode(tok, split.held_out)
    t_tok = time.perf_counter() - t0
    model = small_gpt2(len(tok), n_positions=max(128, cfg.seq_len), n_embd=cfg.n_embd,
                       n_layer=cfg.n_layer, n_head=cfg.n_head, seed=cfg.seed)
    device = resolve_device(cfg.device)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    rng = np.random.default_rng(cfg.seed)
    ppl0 = perplexity(model, held_ids, cfg.seq_len)
    model.train()
    t1 = time.perf_counter()
    for step in range(cfg.steps):
        lr = cfg.lr * min(1.0, (step + 1) / 100) * max(0.0, 1 - step / cfg.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train_ids) - cfg.seq_len - 1, cfg.batch_size)
        b = torch.from_numpy(np.stack([train_ids[s:s + cfg.seq_len + 1] for s in starts]))
        b = b.to(device)
        logits = model(input_ids=b[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on_step is not None:
            on_step({"step": step + 1, "steps": cfg.steps, "loss": float(loss.detach()),
                     "lr": lr})
        if (step + 1) % 500 == 0:
            log.info("pretrain step %d loss %.3f", step + 1, float(loss.detach()))
    t_train = time.perf_counter() - t1
    ppl = perplexity(model, held_ids, cfg.seq_len)
    out.mkdir(parents=True, exist_ok=True)
    model.cpu().save_pretrained(out)
    tok.save_pretrained(out)
    result = {
        "held_out_perplexity": ppl,
        "held_out_perplexity_at_init": ppl0,
        "train_tokens": int(len(train_ids)),
        "held_out_tokens": int(len(held_ids)),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "tokenizer_seconds": t_tok,
        "train_seconds": t_train,
        "train_tokens_per_second": cfg.steps * cfg.batch_size * cfg.seq_len / t_train,
        "config": asdict(cfg),
    }
    (out / "pretrain.json").write_text(json.dumps(result, indent=2))
    return result
