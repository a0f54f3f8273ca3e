"""``PPOLoss``: policy objective + value loss + entropy bonus, with named terms and diagnostics.

The loss is a thin composition of the pure functions in this package. It takes tensors (the
caller evaluates its networks), returns ``loss_objective``, ``loss_critic``, ``loss_entropy`` and
their sum ``loss`` plus detached diagnostics, and never touches a controller: ``beta`` is an
argument, read from the controller by the training loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import cast

import torch

from klppo.core._checks import check_positive, check_same_shape
from klppo.core.advantages import NormScope, normalize_advantage
from klppo.core.band import DEFAULT_EPS
from klppo.core.diagnostics import policy_diagnostics
from klppo.core.names import KLEstimatorChoice, ObjectiveName
from klppo.core.objectives import (
    NO_KNOBS,
    OBJECTIVES,
    Band,
    Knobs,
    Objective,
    PolicyTerm,
    ShapeSpec,
    make_objective,
)
from klppo.core.sequence_objectives import SequenceObjective
from klppo.core.surrogates import Shape
from klppo.core.values import ValueLossKind, explained_variance, value_loss

__all__ = ["ObjectiveName", "PPOLoss", "PolicyTerm", "OBJECTIVES", "PER_SAMPLE"]

#: The per-sample quantities a loss evaluation computes on the way and a training loop's
#: diagnostics reuse instead of evaluating the objective again: the ratio ``w``, the advantage
#: the objective saw (after minibatch normalisation, if on), ``beta_t`` (where the objective
#: has one), the critic's loss and its value-clip indicator. ``PPOLoss``
#: returns them as ``per_sample/<name>`` with ``per_sample=True``; the numpy fast path's
#: :func:`klppo.nn.numpy.closed_form.loss_grads` returns the same names.
PER_SAMPLE: tuple[str, ...] = ("ratio", "advantage", "beta_t", "value_loss", "value_clipped")


def _mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean()


def _row_mean(x: torch.Tensor) -> torch.Tensor:
    """Each row's mean (``PPOLoss(rows=True)``): the number ``x[a].mean()`` gives (torch
    reduces each contiguous row in the order it reduces a 1-D tensor)."""
    return x.mean(-1)


class PPOLoss:
    """The PPO loss for one minibatch.

    Args:
        objective: a name of :data:`~klppo.core.objectives.OBJECTIVES` - ``clip`` (PPO-Clip),
            ``per_sample_kl`` (KLip-PPO template, any beta_t shape), ``kl_penalty`` (PPO-KL,
            scalar beta), ``unclipped`` (plain importance sampling) or ``clip_kl`` (PPO-Clip
            plus a scalar KL penalty: RLlib's default), or one of the trust-region catalogue
            (``cispo``, ``sapo``, ``spo``, ``sq_log_ratio``, ``r2vpo``, ``dppo_tv``, ``dppo_kl``,
            ``clip_cov``, ``kl_cov``; sequence-level ``gspo``, ``gmpo``, ``trm``, ``topr``: see
            docs/algorithms.md) - built with the band, shape, estimator and knob arguments
            below; or an :class:`~klppo.core.objectives.Objective`, which then carries those
            itself.
        eps: clip radius (typical 0.1-0.3). eps_low / eps_high: asymmetric band.
        dual_clip: ``c > 1`` enables the dual clip for A < 0 (clip objectives and templates).
        shape: beta_t shape for ``per_sample_kl`` (see :mod:`klppo.core.surrogates`), or a
            callable ``(ratio, advantage) -> beta_t``.
        softness, softness_low, softness_high: the soft shapes' s (typical 0.02-0.2).
        kl_estimator: the per-sample KL for ``kl_penalty`` / ``clip_kl``: ``analytic`` (the
            caller passes ``kl``, the closed-form KL(pi_old || pi_new) per state) or a sampled
            estimator computed from ``logp_old`` and ``logp_new``.
        knobs: the catalogue objectives' own settings (:class:`~klppo.core.objectives.Knobs`;
            None fields take the objective's defaults).
        vf_coef: weight of the critic loss (typical 0.5). value_loss: ``l2``, ``l1``,
            ``smooth_l1``. value_clip: PPO value clipping radius or None.
        ent_coef: entropy bonus weight (typical 0-0.01).
        normalize_advantage: ``minibatch`` normalises here; ``rollout`` and ``none`` leave the
            advantages as given (the caller normalises once per rollout for ``rollout``).
    """

    def __init__(
        self,
        objective: ObjectiveName | Objective = "clip",
        eps: float = DEFAULT_EPS,
        eps_low: float | None = None,
        eps_high: float | None = None,
        dual_clip: float | None = None,
        shape: Shape | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "clip",
        softness: float | None = None,
        softness_low: float | None = None,
        softness_high: float | None = None,
        kl_estimator: KLEstimatorChoice = "analytic",
        vf_coef: float = 0.5,
        value_loss: ValueLossKind = "l2",
        value_clip: float | None = 0.2,
        ent_coef: float = 0.0,
        normalize_advantage: NormScope = "rollout",
        knobs: Knobs = NO_KNOBS,
    ) -> None:
        if isinstance(objective, Objective):
            self.policy = objective
        else:
            check_positive("eps", eps)
            band = Band(eps, eps_low, eps_high, dual_clip)
            self.policy = make_objective(objective, band,
                                         ShapeSpec(shape, softness, softness_low, softness_high),
                                         kl_estimator, knobs)
        if normalize_advantage not in ("rollout", "minibatch", "none"):
            raise ValueError(f"normalize_advantage must be rollout, minibatch or none, "
                             f"got normalize_advantage={normalize_advantage!r}")
        check_positive("vf_coef", vf_coef, allow_zero=True)
        check_positive("ent_coef", ent_coef, allow_zero=True)
        self.vf_coef, self.value_loss_kind, self.value_clip = vf_coef, value_loss, value_clip
        self.ent_coef = ent_coef
        self.normalize_advantage = normalize_advantage

    @property
    def objective(self) -> str:
        """The objective's name."""
        return self.policy.name

    @property
    def band(self) -> Band:
        return self.policy.band

    def set_eps(self, eps: float) -> None:
        """Move the symmetric clip radius (what the clip actuator drives, between minibatch
        steps); ValueError for an objective without a band or a band with its own edges."""
        b = self.policy.band
        if not self.policy.clipped:
            raise ValueError(f"objective {self.objective!r} has no clip band to set eps on")
        if b.eps_low is not None or b.eps_high is not None or not b.is_scalar:
            raise ValueError("set_eps moves the symmetric radius; this band has its own edges "
                             f"(eps_low={b.eps_low!r}, eps_high={b.eps_high!r})")
        check_positive("eps", eps)
        self.policy.band = dataclasses.replace(b, eps=float(eps))

    def set_edges(self, eps_low: float, eps_high: float) -> None:
        """Move both band radii (what a clip-bound controller such as BAPO drives, between
        minibatch steps): the band becomes ``[1 - eps_low, 1 + eps_high]``. ValueError for an
        objective without a band, a per-sample band or a radius that is not > 0."""
        b = self.policy.band
        if not self.policy.clipped or not b.is_scalar:
            raise ValueError(f"objective {self.objective!r} has no scalar clip band to set "
                             f"edges on")
        check_positive("eps_low", eps_low)
        check_positive("eps_high", eps_high)
        self.policy.band = dataclasses.replace(b, eps_low=float(eps_low),
                                               eps_high=float(eps_high))

    @property
    def needs_analytic_kl(self) -> bool:
        """True when the caller must pass the analytic per-state ``kl`` to :meth:`__call__`."""
        return self.policy.needs_kl

    # -------------------------------------------------------------------- the loss
    def __call__(
        self,
        logp_new: torch.Tensor,
        logp_old: torch.Tensor,
        advantage: torch.Tensor,
        values: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
        old_values: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        kl: torch.Tensor | None = None,
        beta: float | torch.Tensor = 0.0,
        diagnostics: bool = True,
        per_sample: bool = False,
        sequence_ids: torch.Tensor | None = None,
        sample_weight: torch.Tensor | None = None,
        rows: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Loss terms and diagnostics for one minibatch of ``B`` samples.

        Args:
            logp_new: ``[B]`` log pi_new(a|s), with gradient.
            logp_old: ``[B]`` log pi_old(a|s) from the rollout.
            advantage: ``[B]`` advantages.
            values, returns, old_values: ``[B]`` critic outputs, targets and rollout-time values
                (for value clipping); omit ``values`` for a policy-only loss.
            entropy: ``[B]`` per-state entropy of pi_new (with gradient) or None.
            kl: ``[B]`` per-state analytic KL(pi_old || pi_new) for the analytic estimator.
            beta: KL coefficient from the controller (``kl_penalty``, ``clip_kl``); with
                ``rows``, a float or an ``[A]`` tensor, each row's (cast to the inputs' dtype,
                as torch casts a float).
            diagnostics: compute the detached diagnostics (a training loop that computes them
                once per iteration over all minibatches passes False).
            per_sample: also return the detached per-sample quantities of :data:`PER_SAMPLE`
                as ``per_sample/<name>`` (for such a loop's diagnostics).
            sequence_ids: ``[B]`` int, the sequence each sample (token) belongs to; needed by
                the sequence-level objectives (``level == "sequence"``), ignored by the others.
            sample_weight: ``[B]`` detached weights multiplying each sample's objective before
                the mean (a training-inference mismatch correction, :mod:`klppo.core.mismatch`;
                0 masks a sample out); the critic and entropy terms are not weighted.
            rows: every input is ``[A, B]``, the minibatches of ``A`` policies with this loss
                (the rows of a stack; ``beta`` one or one per row), and every term is ``[A]``,
                each row's over its own samples: the numbers each row's own call gives. Token-level
                objectives only, without ``diagnostics`` (ValueError otherwise).

        Returns:
            ``loss`` (to minimise), ``loss_objective``, ``loss_critic``, ``loss_entropy`` and
            detached diagnostics (see :func:`klppo.core.diagnostics.policy_diagnostics`, plus
            ``entropy``, ``explained_variance``, ``value_clip_fraction``, ``kl_penalty``).
        """
        check_same_shape(logp_new=logp_new, logp_old=logp_old, advantage=advantage)
        if kl is not None:
            check_same_shape(logp_new=logp_new, kl=kl)
        if rows and (diagnostics or self.policy.level == "sequence" or logp_new.ndim != 2):
            raise ValueError("PPOLoss(rows=True) takes [A, B] inputs of a token-level objective, "
                             "without diagnostics")
        mean = _row_mean if rows else _mean
        if rows and isinstance(beta, torch.Tensor):  # one per row
            beta = beta.detach().to(logp_new.dtype).reshape(-1, 1)
        adv = advantage.detach()
        if self.normalize_advantage == "minibatch":
            adv = normalize_advantage(adv, rows=rows)
        logp_old = logp_old.detach()
        ratio = torch.exp(logp_new - logp_old)
        # clip's beta_t is only a diagnostic: computed when diagnostics are asked for
        if self.policy.level == "sequence":
            term = cast(SequenceObjective, self.policy).term(
                ratio, logp_new, logp_old, adv, kl, beta, want_beta=diagnostics or per_sample,
                sequence_ids=sequence_ids)
        else:
            term = self.policy.term(ratio, logp_new, logp_old, adv, kl, beta,
                                    want_beta=diagnostics or per_sample)
        zero = logp_new.new_zeros(())
        objective = term.objective
        if sample_weight is not None:
            check_same_shape(logp_new=logp_new, sample_weight=sample_weight)
            objective = sample_weight.detach() * objective
        out: dict[str, torch.Tensor] = {"loss_objective": -mean(objective)}
        diag: dict[str, torch.Tensor] = {}
        if per_sample:
            diag["per_sample/ratio"] = ratio.detach()
            diag["per_sample/advantage"] = adv
            if term.beta_t is not None:
                diag["per_sample/beta_t"] = term.beta_t.detach()
        if diagnostics:
            b = self.policy.band
            diag = policy_diagnostics(logp_new, logp_old, adv, b.eps, b.eps_low, b.eps_high,
                                      term.beta_t)
        if term.kl is not None:
            diag["kl_penalty"] = mean(term.kl.detach())
        if values is not None:
            if returns is None:
                raise ValueError("values given without returns")
            v_loss, v_clipped = value_loss(values, returns, old_values, self.value_clip,
                                           self.value_loss_kind)
            out["loss_critic"] = self.vf_coef * mean(v_loss)
            if per_sample:
                diag["per_sample/value_loss"] = v_loss.detach()
                diag["per_sample/value_clipped"] = v_clipped
            if diagnostics:
                diag["value_loss"] = v_loss.detach().mean()
                diag["value_clip_fraction"] = v_clipped.float().mean()
                diag["explained_variance"] = explained_variance(values, returns)
        else:
            out["loss_critic"] = zero
        if entropy is not None:
            check_same_shape(logp_new=logp_new, entropy=entropy)
            out["loss_entropy"] = -self.ent_coef * mean(entropy)
            if diagnostics:
                diag["entropy"] = entropy.detach().mean()
        else:
            out["loss_entropy"] = zero
        out["loss"] = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        out.update(diag)
        return out

