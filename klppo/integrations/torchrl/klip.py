"""``KLipPPOLoss``: TorchRL's ``ClipPPOLoss`` with klppo's per-sample KL template as policy term.

Per sample the policy objective is the core ``per_sample_kl`` objective on the log-ratio
``log w = logp_new - logp_old``::

    w A + beta_t log w,      beta_t detached, from the shape (``clip``: -w A on the kill set)

``beta_t log w = -beta_t k1`` is a KL penalty whose coefficient varies per sample (``k1`` the
sampled ``KL(pi_old || pi_new)``); it equals ``beta_t logp_new`` up to a constant. With the
``clip`` shape its gradient is PPO-Clip's (Theorem 1), bit for bit in float32 when the mean is
over a power-of-two number of samples, except where ``w`` sits within a float32 rounding of the
band edge (TorchRL clamps ``log w`` at ``log1p(+-eps)``, klppo compares ``w`` with ``1 +- eps``)
or where ``w A`` and ``clip(w) A`` round to the same float32 outside the band (``min`` then
gives TorchRL the unclipped gradient).

The *value* of ``loss_objective`` is the PPO-Clip surrogate at the current ratio (the core's
``clip_objective``, with the same band), so logged numbers read as ClipPPOLoss's; its gradient is
the template's. Other shapes (``linear_ramp``, ``sigmoid``, ``soft_min``, ``spo``,
``asymmetric``, a callable) change the gradient, not that reported value.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import dispatch
from torchrl.objectives import ppo as _ppo

from klppo.core.diagnostics import policy_diagnostics
from klppo.core.objectives import Band, Objective, ShapeSpec, make_objective
from klppo.core.surrogates import ShapeLike, clip_objective
from klppo.integrations.torchrl._shared import (
    WEAKREF_ATTRS,
    advantage,
    entropy_and_critic,
    extend_signature,
    log_weight_named,
    reduce,
)

__all__ = ["KLipPPOLoss", "DIAGNOSTIC_KEYS"]

#: klppo's detached diagnostics added to the output TensorDict (``kl_k1`` is TorchRL's
#: ``kl_approx``; TorchRL's ``clip_fraction``, ``max_ratio``, ``mean_ratio`` stay as they are)
DIAGNOSTIC_KEYS: tuple[str, ...] = (
    "kl_k3", "frac_in", "frac_pass", "frac_kill", "beta_t_abs_mean", "beta_t_kill_mean",
    "beta_t_q50", "beta_t_q90", "beta_t_q99",
)


class KLipPPOLoss(_ppo.ClipPPOLoss):
    """Drop-in for ``torchrl.objectives.ClipPPOLoss`` (every option, key and default of the
    installed TorchRL; see its docstring) whose policy term is klppo's per-sample KL template.

    Extra keyword-only options:

    * ``shape``: the beta_t shape, a name of :data:`klppo.core.surrogates.SHAPES` or a callable
      ``(ratio, advantage) -> beta_t``; ``clip`` (default) gives ClipPPOLoss's gradient.
    * ``softness``, ``softness_low``, ``softness_high``: the soft shapes' s (typical 0.02-0.2).
    * ``dual_clip``: ``c > 1`` adds the dual clip for ``A < 0`` (value and gradient).
    * ``diagnostics``: add the detached keys of :data:`DIAGNOSTIC_KEYS` (default True).

    The band is ``clip_epsilon`` (or ``(eps_low, eps_high)``), read from TorchRL's buffers at
    every call, so a scheduler on ``clip_epsilon`` works as with ClipPPOLoss. ``delay_actor``
    and ``max_importance_ratio`` (a proximal policy apart from the behaviour policy) are refused.
    """

    def __init__(self, actor_network=None, critic_network=None, *, shape: ShapeLike = "clip",
                 softness: float | None = None, softness_low: float | None = None,
                 softness_high: float | None = None, dual_clip: float | None = None,
                 diagnostics: bool = True, **kwargs) -> None:
        for name in ("delay_actor", "max_importance_ratio"):
            if kwargs.get(name) not in (None, False):
                raise NotImplementedError(
                    f"KLipPPOLoss does not serve {name}= yet (the template would need the "
                    "proximal ratio for beta_t and the behaviour ratio for w A); use "
                    "torchrl.objectives.ClipPPOLoss")
        super().__init__(actor_network, critic_network, **kwargs)
        self.shape = ShapeSpec(shape, softness, softness_low, softness_high)
        self.dual_clip = dual_clip
        self.diagnostics = bool(diagnostics)
        # eager validation: an unknown shape, a missing softness or a bad dual clip fail here
        self.policy_objective.beta_t(torch.tensor([1.5, 0.5]), torch.tensor([1.0, -1.0]))

    @property
    def band(self) -> Band:
        """The trust band, from TorchRL's (schedulable) ``clip_epsilon*`` buffers."""
        if self._asymmetric_clip:
            lo, hi = float(self.clip_epsilon_low), float(self.clip_epsilon_high)
            return Band(lo, lo, hi, self.dual_clip)
        return Band(float(self.clip_epsilon), dual_clip=self.dual_clip)

    @property
    def policy_objective(self) -> Objective:
        """The core objective this loss differentiates (``per_sample_kl`` with ``shape``)."""
        return make_objective("per_sample_kl", self.band, self.shape)

    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict = tensordict.clone(False)
        adv = advantage(self, tensordict, padded=True)
        log_weight, dist, kl_approx, _ = log_weight_named(self, tensordict, adv.shape[:-1])
        adv = _ppo._broadcast_advantage_to_log_weight(adv, log_weight)
        _ppo._check_advantage_broadcast(adv, log_weight)
        with torch.no_grad():  # TorchRL's ESS diagnostic
            lw = log_weight.squeeze(-1)
            ess = (2 * lw.logsumexp(0) - (2 * lw).logsumexp(0)).exp()
            batch = log_weight.shape[0]

        objective = self.policy_objective
        ratio = log_weight.exp()
        term = objective.term(ratio, log_weight, None, adv, None, 0.0)
        b = objective.band
        with torch.no_grad():
            value = clip_objective(ratio, adv, b.eps, b.eps_low, b.eps_high, b.dual_clip)
        # the clip surrogate's value, the template's gradient (t - t.detach() is exactly 0)
        gain = value + (term.objective - term.objective.detach())

        clip_fraction = (log_weight.clamp(*self._clip_bounds) != log_weight).to(
            log_weight.dtype).mean()
        td_out = TensorDict({"loss_objective": -gain})
        td_out.set("clip_fraction", clip_fraction)
        td_out.set("kl_approx", kl_approx.detach().mean())
        if self.diagnostics:
            diag = policy_diagnostics(log_weight, torch.zeros_like(log_weight), adv, b.eps,
                                      b.eps_low, b.eps_high, term.beta_t)
            for key in DIAGNOSTIC_KEYS:
                td_out.set(key, diag[key])
        entropy_and_critic(self, td_out, dist, adv, tensordict)
        td_out.set("ESS", ess / batch)
        with torch.no_grad():
            td_out.set("max_ratio", ratio.max())
            td_out.set("mean_ratio", ratio.mean())
        td_out = reduce(self, td_out, tensordict)
        self._clear_weakrefs(tensordict, td_out, *WEAKREF_ATTRS)
        return td_out


# inspect.signature reads a function's __signature__; typeshed does not declare it
KLipPPOLoss.__init__.__signature__ = extend_signature(  # type: ignore[attr-defined]
    _ppo.ClipPPOLoss.__init__, KLipPPOLoss.__init__)
