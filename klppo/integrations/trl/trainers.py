"""What each TRL trainer does with its KL coefficient, read from the installed TRL's source.

One :class:`TrainerKL` per trainer the integration knows: where beta lives, which KL it logs (key,
estimator, direction, unit), where the KL enters (loss or reward) and in which unit it is
penalised, and which trainer settings keep the unit conversion exact. :func:`resolve` maps a
trainer object to its entry and refuses, one line each, what the integration cannot drive.

TRL 1.16 (the line this was written for, pinned in ``constraints.txt``):

* ``GRPOTrainer``: ``self.beta`` (copied from ``GRPOConfig.beta`` at construction) multiplies the
  per-token k3 of KL(policy || reference) **in the loss**; ``kl`` is logged as the token mean of
  that k3 (times the importance ratio, which is 1 on the first pass over a batch, when
  ``use_bias_correction_kl``), one value per loss call, averaged over the logging window.
* ``RLOOTrainer``: ``self.beta`` (from ``RLOOConfig.beta``) multiplies the **per-sequence sum** of
  k1 = log pi_old - log pi_ref, subtracted from each completion's reward at generation; ``kl`` is
  logged as the token mean of that k1 over the generation batch (all processes pooled).
* The PPO trainer (``kl_coef``) is not in TRL 1.16 (neither in ``trl`` nor ``trl.experimental``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from klppo.runs.errors import UserInputError

__all__ = ["TRLIntegrationError", "TrainerKL", "TRAINERS", "TESTED_TRL", "UNITS", "KLUnitTRL",
           "check_trl_version", "resolve", "conversion_problem", "to_unit"]

KLUnitTRL = Literal["per_token_mean", "per_sequence_sum"]
#: the units a controller target may be given in (names of :data:`klppo.core.kl.KLUnit`)
UNITS: tuple[str, ...] = ("per_token_mean", "per_sequence_sum")
#: the TRL line (major.minor) whose source this module describes and whose tests pass
TESTED_TRL = "1.16"


class TRLIntegrationError(UserInputError):
    """A trainer, TRL version or setting the integration cannot drive (raised at attach time)."""


@dataclass(frozen=True)
class TrainerKL:
    """Where one TRL trainer keeps beta and what KL it logs."""

    name: str
    """short name (``grpo``, ``rloo``), written into the saved controller state"""
    class_name: str
    """the TRL class (``GRPOTrainer``)"""
    beta_attr: str
    """the trainer attribute TRL reads at every use of beta"""
    log_key: str
    """the key of the logged KL in the trainer's logs"""
    estimator: str
    """per-token estimator of the logged KL (names of :mod:`klppo.core.kl`)"""
    logged_unit: KLUnitTRL
    """unit of the logged value"""
    penalised_unit: KLUnitTRL
    """unit of the KL that beta multiplies (the loss's or reward's)"""
    placement: Literal["loss", "reward"]
    """where beta times the KL enters"""
    kl_in_every_log: bool
    """True when every training log holds the KL (GRPO: each loss call logs it); RLOO logs it
    only in a window that generated completions"""
    own_methods: tuple[str, ...]
    """methods that use beta or log the KL: a subclass must not override them"""
    direction: str = "KL(policy || reference)"


TRAINERS: dict[str, TrainerKL] = {
    "GRPOTrainer": TrainerKL(
        name="grpo", class_name="GRPOTrainer", beta_attr="beta", log_key="kl", estimator="k3",
        logged_unit="per_token_mean", penalised_unit="per_token_mean", placement="loss",
        kl_in_every_log=True,
        own_methods=("_compute_loss", "compute_loss", "log", "_generate_and_score_completions",
                     "_prepare_inputs")),
    "RLOOTrainer": TrainerKL(
        name="rloo", class_name="RLOOTrainer", beta_attr="beta", log_key="kl", estimator="k1",
        logged_unit="per_token_mean", penalised_unit="per_sequence_sum", placement="reward",
        kl_in_every_log=False,
        own_methods=("_compute_loss", "compute_loss", "log", "_generate_and_score_completions",
                     "_prepare_inputs")),
}

#: attributes (on the trainer) and flags (on its args) of fused losses that copy beta when the
#: trainer is built, so a later change of ``trainer.beta`` would not reach the loss (older TRL's
#: Liger GRPO loss); TRL 1.16 has none, and none may appear unseen
_FUSED_ATTRS = ("liger_grpo_loss", "liger_loss", "fused_loss")
_FUSED_FLAGS = ("use_liger_loss",)


def check_trl_version(version: str) -> None:
    """Refuse a TRL other than the tested line (the trainers' internals change between lines)."""
    if ".".join(version.split(".")[:2]) != TESTED_TRL:
        raise TRLIntegrationError(
            f"trl=={version}: klppo.integrations.trl was written and tested against TRL "
            f"{TESTED_TRL}.x, whose trainers it reads beta and the KL from; install "
            f"'klppo[trl]' with -c constraints.txt (trl pinned there)")


def resolve(trainer: Any) -> TrainerKL:
    """The :class:`TrainerKL` of ``trainer``; :class:`TRLIntegrationError` for a trainer that is
    not a known TRL trainer, a subclass overriding a method that uses beta or logs the KL, a
    beta of 0 or a fused loss holding a copy of beta."""
    import trl

    base, spec = None, None
    for name, entry in TRAINERS.items():
        cls = getattr(trl, name)
        if isinstance(trainer, cls):
            base, spec = cls, entry
    if spec is None or base is None:
        raise TRLIntegrationError(
            f"trainer={type(trainer).__name__}: not a trainer klppo can drive; known: "
            f"{', '.join(sorted(TRAINERS))} (TRL {TESTED_TRL} has no PPOTrainer with kl_coef)")
    changed = [m for m in spec.own_methods if getattr(type(trainer), m) is not getattr(base, m)]
    if changed:
        raise TRLIntegrationError(
            f"trainer={type(trainer).__name__}: overrides {', '.join(changed)} of "
            f"{spec.class_name}, where TRL uses beta or logs the KL; klppo cannot know what the "
            "override does with them")
    beta = getattr(trainer, spec.beta_attr)
    if beta == 0:
        raise TRLIntegrationError(
            f"{spec.class_name}.beta=0: with beta 0 at construction TRL loads no reference model "
            "and logs no KL, so no controller can raise it later; build the trainer with the "
            "controller's initial beta (> 0)")
    fused = [a for a in _FUSED_ATTRS if getattr(trainer, a, None) is not None] + [
        f"args.{f}" for f in _FUSED_FLAGS if getattr(trainer.args, f, False)]
    if fused:
        raise TRLIntegrationError(
            f"{spec.class_name}: {', '.join(fused)} is a fused loss that copied beta={beta} when "
            "the trainer was built; a controller's beta would never reach it")
    return spec


def conversion_problem(spec: TrainerKL, args: Any) -> str | None:
    """Why the logged KL cannot be converted exactly into the other unit with these settings
    (None: it can).

    The conversion multiplies (or divides) the logged per-token mean by the logged mean
    completion length of the same log record. That is exact when both describe the same tokens:
    one generation batch, and (GRPO) one loss call over all of it, with no completion masked out
    of the loss (``mask_truncated_completions``)."""
    if getattr(args, "mask_truncated_completions", False):
        return ("mask_truncated_completions=True: truncated completions count in the logged "
                "mean length but not in the KL")
    if args.logging_strategy != "steps":
        return f"logging_strategy={args.logging_strategy!r}: must be 'steps'"
    ga, spg = args.gradient_accumulation_steps, args.steps_per_generation
    ni, ls = args.num_iterations, args.logging_steps
    if spec.name == "grpo":
        bad = {k: v for k, v in (("gradient_accumulation_steps", ga), ("steps_per_generation", spg),
                                 ("num_iterations", ni), ("logging_steps", ls)) if v != 1}
        if bad:
            return (f"{', '.join(f'{k}={v}' for k, v in bad.items())}: GRPO logs one token mean "
                    "per loss call and the mean length once per generation; the two describe "
                    "the same tokens only with all four equal to 1")
        return None
    if ls * ga > spg * ni:
        return (f"logging_steps * gradient_accumulation_steps = {ls * ga} > steps_per_generation"
                f" * num_iterations = {spg * ni}: a log could average several generation batches,"
                " whose product of means is not the mean of products")
    return None


def to_unit(kl: float, logged_unit: str, unit: str, mean_length: float | None) -> float:
    """The logged KL in ``unit``: a per-sequence sum is the per-token mean times the mean number
    of completion tokens per sequence (both over the same batch), so
    ``mean_i sum_t kl = (sum_{i,t} kl / T) * (T / N)`` with T tokens in N sequences."""
    if unit == logged_unit:
        return kl
    if mean_length is None or not mean_length > 0:
        raise RuntimeError(f"cannot convert the logged KL to {unit}: the log holds no mean "
                           f"completion length (completions/mean_length={mean_length!r})")
    if unit == "per_sequence_sum":
        return kl * mean_length
    return kl / mean_length
