"""The names a config may choose among (objectives, estimators, controllers, shapes, ...), as
``Literal`` types: imports nothing, so configs and ``--help`` can read them without torch. The
modules that implement each choice import their name from here."""

from __future__ import annotations

from typing import Literal

__all__ = ["ObjectiveName", "KLEstimatorChoice", "ControllerName", "StepPreset", "RuleName",
           "NormScope", "MismatchCorrection", "Shape", "ValueLossKind", "KLLossForm"]

ObjectiveName = Literal["clip", "per_sample_kl", "kl_penalty", "unclipped", "clip_kl", "cispo",
                        "sapo", "spo", "sq_log_ratio", "r2vpo", "dppo_tv", "dppo_kl", "clip_cov",
                        "kl_cov", "gspo", "gmpo", "trm", "topr"]
KLEstimatorChoice = Literal["analytic", "k1", "k2", "k3", "abs", "k3_flipped", "tutorial",
                            "k1+", "k3+"]
ControllerName = Literal["fixed", "step", "proportional", "exponential", "pid"]
StepPreset = Literal["ppo_paper", "rllib", "torchrl", "klip"]
RuleName = Literal["rsl_rl", "rl_games"]
NormScope = Literal["rollout", "minibatch", "none"]
MismatchCorrection = Literal["none", "tis", "seq_tis", "mis", "icepop", "m2po"]
Shape = Literal["clip", "asymmetric", "linear_ramp", "sigmoid", "soft_min", "spo"]
ValueLossKind = Literal["l2", "l1", "smooth_l1"]
KLLossForm = Literal["k1_to_go", "k2_sequence", "k3_ratio", "k3"]
