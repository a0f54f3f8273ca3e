"""Gymnasium side: env factory, rollout, the training engine and its entry points."""

from klppo.rl.config import TrainConfig
from klppo.rl.config_checks import validate
from klppo.rl.engine.rundirs import train_batched, train_group
from klppo.rl.presets import PRESETS, preset
from klppo.rl.trainer import ResumeError, TrainingError, TrainResult, final_return, resume, train

__all__ = ["PRESETS", "TrainConfig", "preset", "validate", "TrainResult", "TrainingError",
           "ResumeError", "final_return", "resume", "train", "train_group", "train_batched"]
