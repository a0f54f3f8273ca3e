"""The language-model side's models: a byte-level BPE tokenizer, a small GPT-2, a value head.

Everything is stored in the standard Hugging Face format (``save_pretrained``), so
``AutoModelForCausalLM.from_pretrained(dir)`` and ``AutoTokenizer.from_pretrained(dir)`` load
it, and any local causal LM a user has on disk can take its place.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["train_tokenizer", "small_gpt2", "check_model_dir", "load_lm", "fingerprint",
           "PolicyWithValue", "frozen_reference"]


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


def check_model_dir(path: str | Path, what: str = "model", kind: str = "causal") -> None:
    """Fail early, one line naming ``what`` and the path, unless ``path`` is a Hugging Face
    model directory whose ``config.json`` transformers can read and whose architecture is of
    ``kind`` (``"causal"``: a causal LM; ``"classifier"``: sequence classification; None: any).
    The weights are not loaded."""
    from klppo.lm.config import ConfigError
    from klppo.lm.pretrained import is_named_model, smollm2_gguf

    if kind in ("causal", None) and is_named_model(path):
        smollm2_gguf(what)  # the extra is installed (nothing is loaded)
        return
    if not str(path).strip() or "\0" in str(path):
        raise ConfigError(f"{what}={str(path)!r}: names no path")
    p = Path(path)
    name = f"{what}={str(p)!r}"
    hint = (f"pretrain one with `klppo lm pretrain --out {p}` or pass a HF model directory"
            if p.suffix == "" else "pass a HF model directory")
    if not p.exists():
        raise ConfigError(f"{name}: no such directory; {hint}")
    if not p.is_dir():
        raise ConfigError(f"{name}: is a file, not a model directory; {hint}")
    if not (p / "config.json").is_file():
        raise ConfigError(f"{name}: not a Hugging Face model directory (no config.json); {hint}")
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(p)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; all mean "bad dir"
        raise ConfigError(f"{name}: config.json cannot be read ({_first_line(e)})") from None
    if kind is not None:
        _check_kind(config, kind, name)


#: what each kind of model is called, and the --reward / --model hint for the other kind
_KINDS = {"causal": ("a causal language model (e.g. GPT2LMHeadModel)",
                     "a classifier is a reward: pass it as --reward classifier:PATH"),
          "classifier": ("a sequence-classification model (e.g. "
                         "GPT2ForSequenceClassification)", "a causal LM is a --model")}


def _mapping(kind: str) -> dict:
    """transformers' model_type -> class name(s) of the auto class for ``kind``."""
    from transformers.models.auto import modeling_auto as auto

    return (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if kind == "causal"
            else auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


def _check_kind(config, kind: str, name: str) -> None:
    """ConfigError unless ``config``'s ``architectures`` (else its ``model_type``) is ``kind``:
    transformers would otherwise build the other head from random weights, without a word."""
    from klppo.lm.config import ConfigError

    archs = getattr(config, "architectures", None) or []
    names = _mapping(kind)
    known = {n for v in names.values() for n in ([v] if isinstance(v, str) else v)}
    # without architectures only a causal LM is taken on its model_type (a gpt2 config is
    # both; a classifier's config always names its head)
    ok = any(a in known for a in archs) if archs else (
        kind == "causal" and config.model_type in names)
    if not ok:
        want, hint = _KINDS[kind]
        said = f"architectures {archs}" if archs else f"model_type {config.model_type!r}"
        raise ConfigError(f"{name}: config.json says {said}, not {want}; {hint}")


def _first_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def load_lm(path: str | Path):
    """``(model, tokenizer)`` from a Hugging Face directory (any local causal LM), or of a
    shipped model named in :data:`klppo.lm.pretrained.NAMED_MODELS` (``smollm2``).

    A directory that is not one raises ``ConfigError`` naming ``model`` and the path."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from klppo.lm.config import ConfigError
    from klppo.lm.pretrained import is_named_model, load_named

    check_model_dir(path)
    if is_named_model(path):
        return load_named(str(path))
    path = Path(path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - see check_model_dir
        raise ConfigError(f"model={str(path)!r}: cannot be loaded as a causal LM with its "
                          f"tokenizer ({_first_line(e)})") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def fingerprint(lm: nn.Module, tok: Any) -> str:
    """sha256 of a causal LM's weights (each tensor's name, dtype, shape and bytes, in
    state-dict order) and of its tokenizer's vocabulary: a resumed ``klppo rlhf`` run checks
    that its ``--model`` is still the one it started from (its reference is read from it)."""
    h = hashlib.sha256()
    for name, t in lm.state_dict().items():
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
    return h.hexdigest()


class PolicyWithValue(nn.Module):
    """A causal LM with a scalar value head on its last hidden state (per position)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm: Any = lm  # a transformers causal LM (save_pretrained, config, generate)
        config: Any = lm.config  # a transformers PretrainedConfig
        hidden = config.hidden_size if hasattr(config, "hidden_size") else config.n_embd
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """``(logits [B, L, V], values [B, L])``."""
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask,
                      output_hidden_states=True)
        values = self.value_head(out.hidden_states[-1]).squeeze(-1)
        return out.logits, values


def rollout_copy(lm: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of the policy in ``dtype``, in eval mode, without gradients: the sampler of a
    run whose inference engine works in another precision than training."""
    out = copy.deepcopy(lm).to(dtype).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


@torch.no_grad()
def sync_rollout(rollout: nn.Module, lm: nn.Module) -> nn.Module:
    """Load the policy's current weights into the rollout copy (cast to its precision), as an
    inference engine is synced before it generates; returns ``rollout``."""
    for r, p in zip(rollout.parameters(), lm.parameters(), strict=True):
        r.copy_(p)
    return rollout


@torch.no_grad()
def mix_reference(ref: nn.Module, lm: nn.Module, mix: float) -> None:
    """Move the reference towards the policy, parameter by parameter:
    ``ref <- mix * lm + (1 - mix) * ref`` (``mix`` 1: a copy, a hard reset; TRL's
    ``sync_ref_model`` / TR-DPO: ``ref_model_mixup_alpha``)."""
    for r, p in zip(ref.parameters(), lm.parameters(), strict=True):
        if mix == 1.0:
            r.copy_(p)
        else:
            r.mul_(1.0 - mix).add_(p.detach(), alpha=mix)


def frozen_reference(lm: nn.Module) -> nn.Module:
    """A deep copy of the initial policy, in eval mode, without gradients."""
    ref = copy.deepcopy(lm).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
