"""A tiny causal LM, prompts and a reward for the TRL integration tests (nothing downloaded).

Import only after ``pytest.importorskip("trl")``.
"""

from __future__ import annotations

from pathlib import Path

import torch

PROMPTS = ["Emma was", "Mr. Knightley", "She said", "He was not"]


def tiny_lm_dir(root: Path) -> Path:
    """A 1-layer GPT-2 (16 wide) and a 300-token BPE tokenizer, saved in the HF format (GRPO
    loads its reference model from this path)."""
    from klppo.lm.model import small_gpt2, train_tokenizer

    d = root / "tiny_lm"
    if not (d / "config.json").exists():
        tok = train_tokenizer("Emma was happy. Mr. Knightley was not. She said so. " * 200,
                              vocab_size=300)
        model = small_gpt2(len(tok), n_positions=64, n_embd=16, n_layer=1, n_head=2)
        model.save_pretrained(d)
        tok.save_pretrained(d)
    return d


def reward_e(completions, **kwargs):
    """The number of letters 'e' in each completion: a reward the tiny LM can move."""
    return [float(c.count("e")) for c in completions]


def make_trainer(kind: str, model_dir: Path, out: Path, *, perturb: float = 0.0,
                 eos_bias: float = 0.0, **overrides):
    """A GRPO or RLOO trainer on the tiny LM: 4 completions per step (2 per prompt), 8 new
    tokens, one log per step, fp32 on the CPU. ``perturb`` moves the policy's weights away
    from the reference (loaded from ``model_dir``) so the KL is not 0 at step 1; ``eos_bias``
    pushes the policy's final hidden state towards the end-of-text embedding, so completions
    end early and their lengths differ."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    config, trainer = {"grpo": (GRPOConfig, GRPOTrainer), "rloo": (RLOOConfig, RLOOTrainer)}[kind]
    settings = dict(output_dir=str(out), max_steps=4, per_device_train_batch_size=4,
                    num_generations=2, max_completion_length=8, logging_steps=1,
                    save_strategy="no", report_to="none", bf16=False, use_cpu=True, beta=0.1,
                    learning_rate=3e-2, seed=0, lr_scheduler_type="constant", disable_tqdm=True,
                    data_seed=0)
    settings.update(overrides)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if perturb:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(perturb * torch.randn(p.shape, generator=g))
    if eos_bias:
        with torch.no_grad():
            e = model.transformer.wte.weight[model.config.eos_token_id]
            model.transformer.ln_f.bias.add_(eos_bias * e / e.norm() ** 2)  # eos logit + bias
    return trainer(model=model, reward_funcs=reward_e, args=config(**settings),
                   train_dataset=Dataset.from_dict({"prompt": PROMPTS * 8}))


def klppo_logs(trainer) -> list[dict]:
    """The training log records (one per step) of a finished trainer."""
    return [r for r in trainer.state.log_history if "loss" in r]
