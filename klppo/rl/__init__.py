"""Gymnasium side: env factory, rollout, PPO update and the training loop."""

from klppo.rl.config import TrainConfig, validate
from klppo.rl.presets import PRESETS, preset
from klppo.rl.trainer import ResumeError, TrainingError, TrainResult, final_return, resume, train

__all__ = ["PRESETS", "TrainConfig", "preset", "validate", "TrainResult", "TrainingError",
           "ResumeError", "final_return", "resume", "train"]
