"""KL control in TRL with klppo, all of it: GRPO whose beta a controller drives to a KL target.

    klppo lm pretrain --out runs/lm/base     # or any Hugging Face causal-LM directory
    python examples/trl_minimal.py runs/lm/base

About 25 s on the development machine's CPU: 200 GRPO steps. The PID rule gets gains relative
to the target (kp = 1 / target, ki = 0.15 / target: beta per nat of KL), what held SmolLM2-135M
at its target in GRPO from a weak and a strong start (docs/results/trl-grpo-smollm2-pid). The
learning rate matters as much as beta: with Adam at 1e-3
the policy moves so far per step that even beta = 10 leaves this model at about 0.25 nats per
token, five times the target (docs/algorithms.md, "Can beta hold the KL?").
"""
import os
import sys
import warnings

# nothing leaves this machine: TRL's trainers report their use to huggingface.co when they are
# made, unless told not to (read when huggingface_hub is imported, so before the imports below)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from klppo.integrations.trl import attach  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notes

def reward(completions, **kwargs):  # your reward; here: more words is better
    return [float(len(c.split())) for c in completions]


data = Dataset.from_dict({"prompt": ["It is a truth", "She was", "Mr. Darcy", "Emma"] * 64})
args = GRPOConfig(output_dir="runs/trl-minimal", max_steps=200, per_device_train_batch_size=8,
                  num_generations=4, max_completion_length=12, beta=0.04, learning_rate=1e-4,
                  lr_scheduler_type="constant", logging_steps=1, report_to="none",
                  save_strategy="no", use_cpu=True, disable_tqdm=True, log_level="error")
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward, args=args, train_dataset=data)
trainer.remove_callback(PrinterCallback)  # quiet: one line at the end
control = attach(trainer, "pid", unit="per_token_mean", target=0.05, beta_min=1e-4)
trainer.train()  # every log: the controller reads TRL's KL and sets trainer.beta for what follows
second_half = [r["kl"] for r in control.history[len(control.history) // 2:]]
kl = sum(second_half) / len(second_half)
print(f"second-half KL {kl:.4f} nats/token against the target 0.05 "
      f"({100 * (kl / 0.05 - 1):+.0f}%); beta {control.history[0]['beta']:.3g} -> "
      f"{trainer.beta:.3g} after {trainer.state.global_step} steps")
