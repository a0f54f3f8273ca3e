"""``KLPENPPOLoss``: TorchRL's KL-penalty PPO loss with its KL and beta rule from klppo's core.

Per sample, the policy term is the core ``kl_penalty`` objective ``w A - beta KL`` with
``KL = KL(pi_old || pi_new)`` per state (:func:`klppo.core.kl.analytic_kl` where TorchRL finds a
closed form, else :func:`klppo.core.kl.monte_carlo_kl` with ``samples_mc_kl`` draws from
``pi_old``, as TorchRL samples). beta is the ``beta`` buffer, moved by a
:class:`~klppo.core.controllers.KLController`; the default is the ``step`` rule with TorchRL's
bands (1.5) and its ``increment`` / ``decrement`` factors, so the trajectory of beta is TorchRL's.

A composite action distribution (TorchRL's ``CompositeDistribution``: several heads, e.g. a
discrete and a continuous action) has independent heads given the state, so its KL is the sum of
the heads' KLs, in nats per sample like any other. By default (``composite_kl="per_head"``) each
head's KL is exact where torch has a closed form for it (Normal, Categorical, TanhNormal through
its tanh, ...) and a Monte Carlo estimate with ``samples_mc_kl`` draws otherwise; TorchRL itself
has no closed form for a composite and always estimates the joint KL by Monte Carlo, which
``composite_kl="torchrl"`` reproduces draw for draw (TorchRL's numbers and beta trajectory for the
same random state). Log-probabilities are read under either ``composite_lp_aggregate`` setting,
as TorchRL reads them.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from tensordict.nn import CompositeDistribution, dispatch, set_composite_lp_aggregate
from torchrl.modules.distributions.utils import _warn_mc_kl, has_analytic_kl, sample_and_log_prob
from torchrl.objectives import ppo as _ppo
from torchrl.objectives.utils import _sum_td_features

from klppo.core.controllers import KLController, StepKL
from klppo.core.kl import analytic_kl, monte_carlo_kl
from klppo.core.objectives import make_objective
from klppo.integrations.torchrl._shared import (
    WEAKREF_ATTRS,
    advantage,
    entropy_and_critic,
    extend_signature,
    log_weight_named,
    reduce,
)

__all__ = ["KLPENPPOLoss"]

#: the core objective of this loss: ``w A - beta KL`` with the per-state KL passed in
_PENALTY = make_objective("kl_penalty", kl_estimator="analytic")
_RULE_OPTIONS = ("dtarg", "beta", "increment", "decrement")
#: how the KL of a composite action distribution is computed (see the module docstring)
CompositeKL = Literal["per_head", "torchrl"]


class KLPENPPOLoss(_ppo.KLPENPPOLoss):
    """Drop-in for ``torchrl.objectives.KLPENPPOLoss`` (every option, key and default of the
    installed TorchRL; see its docstring), with the KL and the beta rule from klppo's core.

    Extra keyword-only options:

    * ``controller``: any :class:`~klppo.core.controllers.KLController` (e.g.
      ``make_controller("pid", beta=1.0, target=0.01)``) instead of TorchRL's step rule; it is
      fed the batch mean of the per-state ``KL(pi_old || pi_new)`` in nats per sample, the unit
      of ``dtarg``. Cannot be combined with ``dtarg``, ``beta``, ``increment``, ``decrement``
      (the controller carries its own). Also settable later: ``loss.controller = ...``.
    * ``update_beta_in_forward``: True (TorchRL's behaviour, the default) feeds the controller
      inside every ``forward``; False leaves beta alone in ``forward`` and the training loop calls
      :meth:`update_beta` where it chooses (per minibatch, epoch or iteration).
    * ``composite_kl``: for a composite action distribution, ``"per_head"`` (the default: the
      sum of the heads' KLs, each exact where it has a closed form) or ``"torchrl"`` (TorchRL's
      joint Monte Carlo estimate, draw for draw); see the module docstring.

    The ``beta`` buffer is the single home of beta: :meth:`update_beta` starts the controller
    from it (so a value written to ``loss.beta`` - a scheduler, :meth:`reset` - is respected)
    and writes the result back in the buffer's dtype.

    TorchRL quirk kept for fidelity: with ``update_beta_in_forward=True`` the buffer is changed
    in place (without a version bump) after the penalty is computed, so the backward pass of
    that penalty uses the *updated* beta while the returned value used the old one; gradients
    therefore equal TorchRL's. With ``update_beta_in_forward=False`` the forward snapshots beta
    and value and gradient use the same beta.
    """

    def __init__(self, actor_network=None, critic_network=None, *,
                 controller: KLController | None = None, update_beta_in_forward: bool = True,
                 composite_kl: CompositeKL = "per_head", **kwargs) -> None:
        if composite_kl not in ("per_head", "torchrl"):
            raise ValueError(f"KLPENPPOLoss: composite_kl={composite_kl!r}: must be 'per_head' "
                             f"or 'torchrl'")
        self.composite_kl = composite_kl
        n = kwargs.get("samples_mc_kl", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"KLPENPPOLoss: samples_mc_kl={n!r}: must be an integer >= 1 (the "
                             "draws of the Monte Carlo KL)")
        given = [k for k in _RULE_OPTIONS if k in kwargs]
        if controller is not None and given:
            raise ValueError(
                f"KLPENPPOLoss: controller= replaces TorchRL's step rule, so {given} would be "
                "ignored; set them on the controller instead")
        super().__init__(actor_network, critic_network, **kwargs)
        self.update_beta_in_forward = bool(update_beta_in_forward)
        self.controller = self._torchrl_step_rule() if controller is None else controller

    def _torchrl_step_rule(self) -> StepKL:
        """TorchRL's rule as a klppo step controller: bands 1.5, its factors rounded to the
        buffer's dtype (TorchRL multiplies the buffer by them in that dtype)."""
        in_dtype = lambda v: torch.tensor(v, dtype=self.beta.dtype).item()
        return StepKL(preset="torchrl", beta=float(self.beta), target=self.dtarg,
                      increase=in_dtype(self.increment), decrease=in_dtype(self.decrement))

    # ------------------------------------------------------------------ beta
    @property
    def controller(self) -> KLController:
        """The controller that moves beta; assigning one also sets the buffer to its beta."""
        return self._controller

    @controller.setter
    def controller(self, controller: KLController) -> None:
        if not isinstance(controller, KLController):
            raise TypeError("controller must be a klppo.core.controllers.KLController, got "
                            f"{type(controller).__name__}")
        self._controller = controller
        self._controller_init = copy.deepcopy(controller.state_dict())
        self._write_beta(controller.value)
        if controller.target is not None:
            self.dtarg = controller.target

    def _write_beta(self, value: float) -> None:
        # .data: no version bump, exactly as TorchRL's in-place ``self.beta.data *= ...``
        self.beta.data.copy_(torch.as_tensor(value, dtype=self.beta.dtype))

    def update_beta(self, kl: float | torch.Tensor, n_steps: int = 1) -> float:
        """Feed one KL measurement to the controller and write the new beta into ``beta``.

        Args:
            kl: observed ``KL(pi_old || pi_new)``, a scalar in nats per sample (the batch mean
                of the per-state KL, e.g. ``out["kl"].mean()``), the unit of ``dtarg``.
            n_steps: samples the measurement covers (the proportional rule uses it).

        Returns:
            The new beta, as stored in the buffer.
        """
        if isinstance(kl, torch.Tensor):
            if kl.numel() != 1:
                raise ValueError("update_beta takes a scalar KL (nats per sample), got a tensor "
                                 f"of shape {tuple(kl.shape)}; pass its mean")
            kl = kl.item()
        state = self._controller.state_dict()
        state["beta"] = float(self.beta)
        self._controller.load_state_dict(state)
        self._write_beta(self._controller.update(float(kl), n_steps))
        return float(self.beta)

    def reset(self) -> None:
        """TorchRL's reset (beta back to its initial value) plus the controller's state."""
        super().reset()
        self._controller.load_state_dict(copy.deepcopy(self._controller_init))
        self._write_beta(self._controller.value)

    # ------------------------------------------------------------------ KL
    def kl(self, previous_dist, current_dist, batch_shape: torch.Size | None = None
           ) -> torch.Tensor:
        """Per-state ``KL(pi_old || pi_new)`` in nats: closed form where TorchRL has one, else
        ``samples_mc_kl`` draws from ``pi_old`` (sampled, not reparameterised, as TorchRL). A
        composite distribution's is the sum over its heads (``composite_kl``; ``batch_shape``
        is the samples' shape, which TorchRL's joint estimate needs)."""
        composite = [isinstance(d, CompositeDistribution) for d in (previous_dist, current_dist)]
        if any(composite):
            if not all(composite):
                raise TypeError("KLPENPPOLoss: the previous and current distributions must both "
                                "be composite, or neither")
            if self.composite_kl == "torchrl":
                return self._joint_mc_kl(previous_dist, current_dist, batch_shape)
            return self._per_head_kl(previous_dist, current_dist, batch_shape)
        return self._head_kl(previous_dist, current_dist)

    def _per_head_kl(self, previous_dist, current_dist,
                     batch_shape: torch.Size | None) -> torch.Tensor:
        """The sum over the heads of each head's :meth:`_head_kl` (the heads are independent
        given the state, so their KLs add), a head's dimensions past the samples' batch
        (``batch_shape``; default: the fewest any head has) summed as TorchRL sums its
        log-probabilities' features."""
        missing = set(previous_dist.dists) ^ set(current_dist.dists)
        if missing:
            raise KeyError(f"KLPENPPOLoss: the composite distributions have different heads "
                           f"({sorted(map(str, missing))})")
        kls = [self._head_kl(p, current_dist.dists[name])
               for name, p in previous_dist.dists.items()]
        n = len(batch_shape) if batch_shape is not None else min(k.ndim for k in kls)
        kls = [k.sum(tuple(range(n, k.ndim))) if k.ndim > n else k for k in kls]
        return torch.stack(torch.broadcast_tensors(*kls)).sum(0)

    def _joint_mc_kl(self, previous_dist, current_dist,
                     batch_shape: torch.Size | None) -> torch.Tensor:
        """TorchRL's composite KL: ``samples_mc_kl`` joint draws from ``pi_old``, each head's
        log-probabilities kept per key and summed, averaged over the draws."""
        _warn_mc_kl(previous_dist, current_dist)
        with set_composite_lp_aggregate(False):
            x, previous_log_prob = sample_and_log_prob(previous_dist, (self.samples_mc_kl,))
            current_log_prob = current_dist.log_prob(x)
        if is_tensor_collection(previous_log_prob):
            if batch_shape is not None and previous_log_prob.batch_size != batch_shape:
                previous_log_prob.batch_size = (self.samples_mc_kl,) + tuple(batch_shape)
                current_log_prob.batch_size = (self.samples_mc_kl,) + tuple(batch_shape)
            previous_log_prob = _sum_td_features(previous_log_prob)
            current_log_prob = _sum_td_features(current_log_prob)
        return (previous_log_prob - current_log_prob).mean(0)

    def _head_kl(self, previous_dist, current_dist) -> torch.Tensor:
        """One distribution's (or head's) KL: closed form where TorchRL has one, else Monte
        Carlo."""
        if has_analytic_kl(previous_dist, current_dist):
            return analytic_kl(previous_dist, current_dist, num_samples_mc=self.samples_mc_kl)
        _warn_mc_kl(previous_dist, current_dist)
        return monte_carlo_kl(previous_dist, current_dist, self.samples_mc_kl,
                              reparameterize=False)

    def _previous_dist(self, tensordict: TensorDictBase, tensordict_copy: TensorDictBase):
        if self.delay_actor:
            with torch.no_grad(), self.target_actor_network_params.to_module(
                    self.actor_network, preserve_module_state=False):
                return self.actor_network.get_dist(tensordict_copy)
        try:
            return self.actor_network.build_dist_from_params(tensordict)
        except KeyError as err:
            raise KeyError(
                "The parameters of the distribution were not found. "
                f"Make sure they are provided to {type(self).__name__}.") from err

    # ------------------------------------------------------------------ forward
    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        tensordict_copy = tensordict.copy()
        previous_dist = self._previous_dist(tensordict, tensordict_copy)
        adv = advantage(self, tensordict_copy, padded=False)
        log_weight, dist, kl_approx, log_is_weight = log_weight_named(
            self, tensordict_copy, adv.shape[:-1])
        adv = _ppo._broadcast_advantage_to_log_weight(adv, log_weight)
        _ppo._check_advantage_broadcast(adv, log_weight)
        if log_is_weight is not None:  # the surrogate is weighted by pi_theta / pi_behav
            log_weight = log_weight + log_is_weight
        with (self.actor_network_params.to_module(self.actor_network,
                                                  preserve_module_state=False)
              if self.functional else contextlib.nullcontext()):
            current_dist = self.actor_network.get_dist(tensordict_copy)
        kl = self.kl(previous_dist, current_dist, adv.shape[:-1]).unsqueeze(-1)
        beta = self.beta if self.update_beta_in_forward else self.beta.clone()
        term = _PENALTY.term(log_weight.exp(), None, None, adv, kl, beta, want_beta=False)
        if self.update_beta_in_forward:
            self.update_beta(kl.mean())
        td_out = TensorDict({"loss_objective": -term.objective, "kl": kl.detach(),
                             "kl_approx": kl_approx.detach().mean()})
        entropy_and_critic(self, td_out, dist, adv, tensordict_copy)
        td_out = reduce(self, td_out, tensordict_copy)
        self._clear_weakrefs(tensordict, td_out, *WEAKREF_ATTRS)
        return td_out


# inspect.signature reads a function's __signature__; typeshed does not declare it
KLPENPPOLoss.__init__.__signature__ = extend_signature(  # type: ignore[attr-defined]
    _ppo.KLPENPPOLoss.__init__, KLPENPPOLoss.__init__)
