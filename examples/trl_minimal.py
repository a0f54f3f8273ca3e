"""KL control in TRL with klppo, all of it: GRPO whose beta a controller drives to a KL target.

    klppo lm pretrain --out runs/lm/base     # or any Hugging Face causal-LM directory
    python examples/trl_minimal.py runs/lm/base
"""
import sys
import warnings

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from klppo.integrations.trl import attach

warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notes

def reward(completions, **kwargs):  # your reward; here: more words is better
    return [float(len(c.split())) for c in completions]


data = Dataset.from_dict({"prompt": ["It is a truth", "She was", "Mr. Darcy", "Emma"] * 8})
args = GRPOConfig(output_dir="runs/trl-minimal", max_steps=8, per_device_train_batch_size=8,
                  num_generations=4, max_completion_length=12, beta=0.04, learning_rate=1e-3,
                  logging_steps=1, report_to="none", save_strategy="no", use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward, args=args, train_dataset=data)
attach(trainer, "proportional", unit="per_token_mean", target=0.05, horizon=64, beta_min=1e-4)
trainer.train()  # every log: the controller reads TRL's KL and sets trainer.beta for what follows
print(f"beta after {trainer.state.global_step} steps: {trainer.beta:.4f} (target 0.05 nats/token)")
