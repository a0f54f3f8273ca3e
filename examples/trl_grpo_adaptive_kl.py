"""TRL's GRPOTrainer on klppo's Austen sentiment task, with a fixed beta and with a klppo
controller driving beta (klppo.integrations.trl), from a too-strong and a too-weak start.

Each arm writes OUT/runs/ARM__SEED/{config.yaml, metadata.json, metrics.jsonl} in the layout of
`klppo rlhf compare` (one record per GRPO step: VADER score, the KL in the controller's unit
against the target, beta, held-out perplexity every few steps, sample texts), then the report
(OUT/report/report.html, summary.md, curves.csv) is written by klppo.report.lm.lm_report.

    python examples/trl_grpo_adaptive_kl.py --tiny --out runs/trl-grpo-tiny    # CPU, ~40 s
    python examples/trl_grpo_adaptive_kl.py --model smollm2 --out runs/trl-grpo  # for a GPU
    python examples/trl_grpo_adaptive_kl.py --model smollm2 --lora --lr 1e-4 ...  # LoRA (peft)

--tiny pretrains a small Austen GPT-2 first (unless --model is given): 150 steps per arm at Adam
1e-3, where a fixed beta of 1.0 holds this model below the 0.05 target and 0.01 lets it run
above. The full setting is meant for SmolLM2-135M-Instruct (the smollm2 extra, see
docs/integrations.md) on a GPU. It ends by printing each arm's second-half KL beside the target.

The adaptive arms use klppo's PID rule with gains relative to the target (``kp = 1 / target``,
``ki = 0.15 / target``: ``klppo.core.controllers.relative_pid_gains``), which held SmolLM2-135M
at its target from both starts (docs/results/trl-grpo-smollm2-pid); ``--set
controller=proportional`` runs the proportional rule instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

# nothing leaves this machine: TRL's trainers report their use to huggingface.co when they are
# made, unless told not to (read when huggingface_hub is imported, so before TRL is)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import yaml


@dataclass
class Setting:
    steps: int = 200
    prompts_per_step: int = 8
    completions_per_prompt: int = 8
    prompt_len: int = 16
    completion_len: int = 32
    lr: float = 1e-5
    strong_beta: float = 0.5
    weak_beta: float = 0.005
    target: float = 0.05
    unit: str = "per_token_mean"
    controller: str = "pid"  # or proportional (held until the KL reaches the target)
    horizon: float | None = None  # None: derived from the run (klppo.core.controllers.run_horizon)
    kp: float | None = None  # pid gains, beta per nat (None: relative_pid_gains of the target)
    ki: float | None = None
    kd: float | None = None
    lora: bool = False  # train LoRA adapters (peft) instead of every parameter
    eval_every: int = 20
    eval_windows: int = 64
    eval_seq_len: int = 64


TINY = Setting(steps=150, prompts_per_step=2, completions_per_prompt=4, prompt_len=8,
               completion_len=10, lr=1e-3, strong_beta=1.0, weak_beta=0.01, target=0.05,
               eval_every=50, eval_windows=8, eval_seq_len=32)


def tiny_base(out: Path) -> Path:
    """A small Austen GPT-2 (`klppo lm pretrain` with a narrow model and few steps; held-out
    perplexity about 200), reused when already there."""
    from klppo.lm.pretrain import PretrainConfig, pretrain

    d = out / "base"
    if not (d / "config.json").is_file():
        pretrain(PretrainConfig(out=str(d), steps=120, batch_size=8, seq_len=32, vocab_size=512,
                                n_embd=32, n_layer=2, n_head=2, torch_threads=2))
    return d


def model_dir(model: str, out: Path) -> Path:
    """A Hugging Face directory (TRL loads the policy and the reference from it)."""
    from klppo.lm.model import check_model_dir
    from klppo.lm.pretrained import export_named, is_named_model

    check_model_dir(model)
    return export_named(model, out / model) if is_named_model(model) else Path(model)


def prompts(tok, train_ids: np.ndarray, n: int, length: int, seed: int) -> list[str]:
    """``n`` windows of ``length`` tokens of the Austen training text, as text."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(train_ids) - length, n)
    return tok.batch_decode([train_ids[s:s + length] for s in starts])


class VaderWithSamples:
    """TRL reward function (VADER compound of the completion) that keeps the last batch."""

    __name__ = "vader"

    def __init__(self) -> None:
        from klppo.lm.reward import VaderReward

        self.vader = VaderReward()
        self.last: dict = {}

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        from klppo.lm.scoring import distinct_n

        scores = self.vader(prompts, completions)
        self.last = {"prompts": list(prompts), "completions": list(completions),
                     "scores": scores,
                     "distinct_2": distinct_n(list(completion_ids or []), 2)}
        return scores


def recorder(run_dir: Path, trainer, reward: VaderWithSamples, held_ids, s: Setting):
    """A callback writing one `klppo rlhf`-style record per step (after the klppo callback)."""
    from transformers import TrainerCallback

    from klppo.lm.pretrain import perplexity

    per_step = s.prompts_per_step * s.completions_per_prompt

    def ppl() -> float:
        return perplexity(trainer.model, held_ids, s.eval_seq_len, s.eval_windows)

    class Recorder(TrainerCallback):
        initial = ppl()

        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or "klppo/beta" not in logs:
                return
            it = state.global_step
            m = {"iteration": it, "global_step": it * per_step, "episodes": it * per_step,
                 "score": logs["rewards/vader/mean"], "kl": logs["klppo/kl"],
                 "kl_unit": s.unit, "kl_estimator": "k3", "kl_logged_per_token_mean": logs["kl"],
                 "kl_target": s.target, "kl_abs_error": abs(logs["klppo/kl"] - s.target),
                 "beta": logs["klppo/beta"], "beta_after": logs["klppo/beta_next"],
                 "kl_relative_error": logs["klppo/relative_error"],
                 "completion_mean_length": logs["completions/mean_length"],
                 "distinct_2": reward.last["distinct_2"]}
            if it % s.eval_every == 0 or it == 1 or it == s.steps:
                m["held_out_perplexity"] = ppl()
                m["held_out_perplexity_initial"] = self.initial
                last = reward.last
                m["samples"] = [{"prompt": p, "response": c, "score": float(x)} for p, c, x in
                                list(zip(last["prompts"], last["completions"],
                                         last["scores"]))[:4]]
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(m) + "\n")

    return Recorder()


def lora_config():
    """LoRA adapters (rank 16) on every attention and MLP projection; the reference is the
    base model with the adapters off (TRL's peft path), so no second model is loaded."""
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules="all-linear")


def second_half(out: Path, s: Setting) -> list[tuple[str, int, float, float]]:
    """``(arm, seed, second-half mean KL, second-half mean score)`` of every finished arm."""
    rows = []
    for run in sorted((out / "runs").iterdir()):
        recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        half = [r for r in recs if r["iteration"] > s.steps // 2]
        arm, seed = run.name.rsplit("__", 1)
        rows.append((arm, int(seed), float(np.mean([r["kl"] for r in half])),
                     float(np.mean([r["score"] for r in half]))))
    return rows


def run_arm(name: str, seed: int, beta: float, controller: str, base: Path, out: Path,
            s: Setting) -> Path:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from klppo.core.controllers import make_controller
    from klppo.integrations.trl import attach
    from klppo.lm.experiment import corpus_ids
    from klppo.runs.rundir import write_metadata

    run_dir = out / "runs" / f"{name}__{seed}"
    if (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()  # an arm is rerun whole
    run_dir.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(base)
    train_ids, held_ids = corpus_ids(tok)
    n = s.steps * s.prompts_per_step
    data = Dataset.from_dict({"prompt": prompts(tok, train_ids, n, s.prompt_len, seed)})
    cuda = torch.cuda.is_available()
    args = GRPOConfig(
        output_dir=str(run_dir / "trl"), max_steps=s.steps, seed=seed, data_seed=seed,
        per_device_train_batch_size=s.prompts_per_step * s.completions_per_prompt,
        num_generations=s.completions_per_prompt, max_completion_length=s.completion_len,
        learning_rate=s.lr, lr_scheduler_type="constant", beta=beta, logging_steps=1,
        save_strategy="no", report_to="none", bf16=cuda, use_cpu=not cuda, disable_tqdm=True,
        log_level="warning", model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"})
    reward = VaderWithSamples()
    trainer = GRPOTrainer(model=str(base), reward_funcs=reward, args=args, train_dataset=data,
                          peft_config=lora_config() if s.lora else None)
    if controller == "fixed":
        attach(trainer, make_controller("fixed", beta=beta, target=s.target), unit=s.unit)
    else:
        horizon = {"horizon": "auto" if s.horizon is None else s.horizon} \
            if controller == "proportional" else {}
        gains = {k: v for k, v in (("kp", s.kp), ("ki", s.ki), ("kd", s.kd)) if v is not None} \
            if controller == "pid" else {}
        attach(trainer, controller, unit=s.unit, target=s.target, beta_min=1e-4, **horizon,
               **gains)
    trainer.remove_callback(PrinterCallback)  # quiet: the summary table comes at the end
    trainer.add_callback(recorder(run_dir, trainer, reward, held_ids, s))
    config = {"kind": "trl_grpo", "arm": name, "seed": seed, "model": str(base),
              "controller": controller, "beta": beta, **dataclasses.asdict(s)}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    write_metadata(run_dir, {"kind": "trl_grpo"})  # the machine and software, for the report
    trainer.train()
    return run_dir


ARMS = ("fixed_strong", "adaptive_from_strong", "fixed_weak", "adaptive_from_weak")


def with_fields(s: Setting, items: list[str], p: argparse.ArgumentParser) -> Setting:
    """``s`` with each FIELD=VALUE of ``items`` (the value read as YAML, checked against the
    field's type)."""
    over = {}
    names = {f.name: f for f in dataclasses.fields(Setting)}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or k not in names:
            p.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {sorted(names)}")
        value = yaml.safe_load(v)
        want = float if getattr(s, k) is None else type(getattr(s, k))  # None: horizon
        if value is not None and not isinstance(value, (want, int) if want is float else want):
            p.error(f"--set {item!r}: {k} must be a {want.__name__}")
        over[k] = float(value) if want is float and value is not None else value
    return dataclasses.replace(s, **over)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/trl-grpo", help="comparison directory")
    p.add_argument("--model", default=None,
                   help="HF model directory or 'smollm2' (default: --tiny pretrains one)")
    p.add_argument("--tiny", action="store_true",
                   help="the small CPU setting (about 40 s on 2 cores)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per arm")
    p.add_argument("--lr", type=float, default=None, help="learning rate (Adam)")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (needs peft)")
    p.add_argument("--arms", nargs="+", default=None, choices=ARMS,
                   help="run only these arms (default: all four)")
    p.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="other Setting fields, e.g. completion_len=16 target=0.1")
    p.add_argument("--no-report", action="store_true",
                   help="skip the report (another process writes it)")
    a = p.parse_args(argv)
    # TRL calls transformers' renamed gradient-checkpointing API: its deprecation notes are
    # neither this example's nor the user's to act on
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no bar per model load
    s = dataclasses.replace(TINY if a.tiny else Setting())
    if a.steps is not None:
        s.steps = a.steps
    if a.lr is not None:
        s.lr = a.lr
    s.lora = a.lora
    s = with_fields(s, a.set, p)
    out = Path(a.out)
    if a.model is None and not a.tiny:
        p.error("--model is required without --tiny (a HF directory, or smollm2)")
    t0 = time.perf_counter()
    base = model_dir(a.model, out) if a.model else tiny_base(out)
    arms = [("fixed_strong", s.strong_beta, "fixed"),
            ("adaptive_from_strong", s.strong_beta, s.controller),
            ("fixed_weak", s.weak_beta, "fixed"),
            ("adaptive_from_weak", s.weak_beta, s.controller)]
    for seed in a.seeds:
        for name, beta, ctrl in arms:
            if a.arms is None or name in a.arms:
                run_arm(name, seed, beta, ctrl, base, out, s)
                print(f"{name} seed {seed}: done ({time.perf_counter() - t0:.0f}s)", flush=True)
    if a.no_report:
        return 0
    from klppo.report.lm import lm_report

    page, _ = lm_report(out, out / "report")
    print(f"second half (steps {s.steps // 2 + 1}-{s.steps}), KL in nats per token "
          f"({s.unit}) against the target {s.target}:")
    for arm, seed, kl, score in second_half(out, s):
        print(f"  {arm:<22} seed {seed}  KL {kl:.4f} ({100 * (kl / s.target - 1):+5.0f}% of the "
              f"target)  score {score:.3f}")
    print(f"report: {page}  ({time.perf_counter() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
