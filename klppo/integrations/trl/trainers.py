"""What each TRL trainer does with its KL coefficient, read from the installed TRL's source.

One :class:`TrainerKL` per trainer the integration knows: where beta lives, which KL it logs (key,
estimator, direction, unit), where the KL enters (loss or reward) and in which unit it is
penalised. :func:`resolve` maps a trainer object to its entry and refuses, one line each, what the
integration cannot drive; :func:`check_internals` accepts a TRL release by the lines of its
source the integration relies on (not by its version string).

TRL 1.15 and 1.16 (the same loss code; the tests train with 1.16):

* ``GRPOTrainer``: ``self.beta`` (copied from ``GRPOConfig.beta`` at construction) multiplies the
  per-token k3 of KL(policy || reference) **in the loss**, times the importance weight when
  ``use_bias_correction_kl``; the tokens are then reduced by the ``loss_type``'s normaliser, so
  the unit beta multiplies is the loss type's (:data:`~klppo.integrations.trl.grpo_kl.LOSS_UNITS`):
  a token mean (``dapo``, the default, ``bnpo``, ``cispo``, ``vespo``), a mean over sequences of
  token means (``grpo``, ``sapo``), a mean of per-sequence sums (``luspo``) or the sum over
  ``B * max_completion_length`` (``dr_grpo``). ``kl`` is logged as the token mean whatever the
  loss type; klppo reads each loss call's per-token KL instead
  (:class:`~klppo.integrations.trl.grpo_kl.KLTap`), so every unit is exact.
* ``RLOOTrainer``: ``self.beta`` (from ``RLOOConfig.beta``) multiplies the **per-sequence sum** of
  k1 = log pi_old - log pi_ref, subtracted from each completion's reward at generation; ``kl`` is
  logged as the token mean of that k1 over the generation batch (all processes pooled).
* The PPO trainer (``kl_coef``) is in neither line (neither in ``trl`` nor ``trl.experimental``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from klppo.integrations.trl.grpo_kl import LOSS_UNITS, UNIT_MEANINGS
from klppo.runs.errors import UserInputError
from klppo.runs.install import install_hint

__all__ = ["TRLIntegrationError", "TrainerKL", "TRAINERS", "TESTED_TRL", "UNITS", "KLUnitTRL",
           "check_internals", "resolve", "penalised_unit", "conversion_problem", "to_unit"]

KLUnitTRL = Literal["per_token_mean", "per_sequence_sum"]
#: the units a controller target may be given in: GRPO serves all (read per token, exact);
#: RLOO the first two (its logged token mean converted with the mean completion length)
UNITS: tuple[str, ...] = tuple(UNIT_MEANINGS)
#: the TRL lines (major.minor) whose trainers the tests trained with; others are accepted when
#: their source has the lines of :data:`INTERNALS` (TRL 1.15 has them, but its trainers need
#: triton for their log-probabilities, so they do not train on a CPU-only torch)
TESTED_TRL: tuple[str, ...] = ("1.16",)


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
    penalised_unit: KLUnitTRL | None
    """unit of the KL that beta multiplies (the reward's); None: the loss type's
    (:func:`penalised_unit`)"""
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
        logged_unit="per_token_mean", penalised_unit=None, placement="loss",
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


#: per trainer, per method: the lines of TRL's source (whitespace aside) that this integration
#: relies on; a TRL whose source lacks one is refused at attach time
INTERNALS: dict[str, dict[str, tuple[str, ...]]] = {
    "GRPOTrainer": {
        "_compute_loss": (
            "self._get_per_token_logps_and_entropies(model,input_ids,attention_mask,"
            "logits_to_keep,compute_entropy=True",
            "per_token_kl=(torch.exp(ref_per_token_logps-per_token_logps)-"
            "(ref_per_token_logps-per_token_logps)-1)",
            "ifself.args.use_bias_correction_kl:per_token_kl=per_token_kl*coef_1",
            "per_token_loss=per_token_loss+self.beta*per_token_kl",
            'ifself.loss_typein["grpo","sapo"]:loss=((per_token_loss*mask).sum(-1)/'
            "mask.sum(-1).clamp(min=1.0)).mean()",
            'elifself.loss_type=="bnpo":loss=(per_token_loss*mask).sum()/'
            "mask.sum().clamp(min=1.0)",
            'elifself.loss_type=="dr_grpo":loss=(per_token_loss*mask).sum()/'
            "(per_token_loss.size(0)*self.max_completion_length)",
            'elifself.loss_typein["cispo","dapo","vespo"]:',
            'elifself.loss_type=="luspo":',
            "loss=(per_token_loss*mask).sum(-1).mean()",
            'self._metrics[mode]["kl"].append(global_masked_mean(per_token_kl))'),
    },
    "RLOOTrainer": {
        "_generate_and_score_completions": (
            "per_token_kl=old_per_token_logps-ref_per_token_logps",
            "kl=(per_token_kl*completion_mask).sum(-1)",
            "rewards=rewards-self.beta*kl"),
    },
}


def check_internals(class_name: str) -> None:
    """Refuse a TRL whose trainer ``class_name`` lacks a line of :data:`INTERNALS` (TRL's
    trainers change between lines; a release with the same lines behaves as the tested ones)."""
    import inspect

    import trl

    cls = getattr(trl, class_name)
    for method, lines in INTERNALS[class_name].items():
        try:
            source = "".join(inspect.getsource(getattr(cls, method)).split())
        except (AttributeError, OSError, TypeError) as e:
            raise TRLIntegrationError(
                f"trl=={trl.__version__}: {class_name}.{method} cannot be read ({e}); klppo "
                "reads beta and the KL from it") from None
        missing = [line for line in lines if line not in source]
        if missing:
            raise TRLIntegrationError(
                f"trl=={trl.__version__}: {class_name}.{method} lacks {missing[0]!r} (whitespace "
                f"removed), which klppo relies on to know what beta multiplies; lines tested: "
                f"TRL {', '.join(TESTED_TRL)} ({install_hint('trl')})")


def penalised_unit(spec: TrainerKL, args: Any) -> str:
    """The unit of the KL that beta multiplies in ``spec``'s trainer with these settings."""
    if spec.penalised_unit is not None:
        return spec.penalised_unit
    loss_type = getattr(args, "loss_type", None)
    if loss_type not in LOSS_UNITS:
        raise TRLIntegrationError(
            f"loss_type={loss_type!r}: klppo knows what beta multiplies for "
            f"{', '.join(sorted(LOSS_UNITS))}")
    return LOSS_UNITS[loss_type]


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
            f"{', '.join(sorted(TRAINERS))} (TRL 1.15-1.16 have no PPOTrainer with kl_coef)")
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
    """Why RLOO's logged KL cannot be converted exactly into the other unit with these settings
    (None: it can; GRPO's KL is read per token and needs no conversion).

    The conversion multiplies (or divides) the logged per-token mean by the logged mean
    completion length of the same log record. That is exact when both describe the same tokens:
    one generation batch, with no completion masked out of the loss
    (``mask_truncated_completions``)."""
    if getattr(args, "mask_truncated_completions", False):
        return ("mask_truncated_completions=True: truncated completions count in the logged "
                "mean length but not in the KL")
    if args.logging_strategy != "steps":
        return f"logging_strategy={args.logging_strategy!r}: must be 'steps'"
    ga, spg = args.gradient_accumulation_steps, args.steps_per_generation
    ni, ls = args.num_iterations, args.logging_steps
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
