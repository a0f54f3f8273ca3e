"""The language-model side's models: a byte-level BPE tokenizer, a small GPT-2, a value head.

Everything is stored in the standard Hugging Face format (``save_pretrained``), so
``AutoModelForCausalLM.from_pretrained(dir)`` and ``AutoTokenizer.from_pretrained(dir)`` load
it, and any local causal LM a user has on disk can take its place.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

__all__ = ["train_tokenizer", "small_gpt2", "load_lm", "PolicyWithValue", "frozen_reference"]


def train_tokenizer(text: str, vocab_size: int = 2048):
    """A byte-level BPE tokenizer (the ``tokenizers`` package) as a transformers fast tokenizer.

    ``<|endoftext|>`` is the end-of-text token (GPT-2 convention) and also the pad token.
    """
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([text[i:i + 100_000] for i in range(0, len(text), 100_000)],
                            vocab_size=vocab_size, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    return tok


def small_gpt2(vocab_size: int, n_positions: int = 128, n_embd: int = 128, n_layer: int = 4,
               n_head: int = 4, seed: int = 0):
    """A GPT-2 of about 1M parameters (with the default sizes and a 2k vocabulary)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                     n_layer=n_layer, n_head=n_head, bos_token_id=0, eos_token_id=0,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def load_lm(path: str | Path):
    """``(model, tokenizer)`` from a Hugging Face directory (any local causal LM)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model={str(path)!r}: no config.json; pretrain one with "
                                f"`klppo lm pretrain --out {path}` or pass a HF model directory")
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tok


class PolicyWithValue(nn.Module):
    """A causal LM with a scalar value head on its last hidden state (per position)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        hidden = lm.config.hidden_size if hasattr(lm.config, "hidden_size") else lm.config.n_embd
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """``(logits [B, L, V], values [B, L])``."""
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask,
                      output_hidden_states=True)
        values = self.value_head(out.hidden_states[-1]).squeeze(-1)
        return out.logits, values


def frozen_reference(lm: nn.Module) -> nn.Module:
    """A deep copy of the initial policy, in eval mode, without gradients."""
    ref = copy.deepcopy(lm).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
