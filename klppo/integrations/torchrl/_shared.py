"""Pieces of TorchRL's PPO ``forward`` that both klppo losses keep as TorchRL has them.

The advantage lookup (and normalisation), the entropy bonus, the critic loss and the reduction
are TorchRL's own code paths, called through its helpers, so a klppo loss differs from TorchRL's
only in the policy term it replaces.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase, is_tensor_collection
from torchrl.objectives.utils import _sum_td_features

WEAKREF_ATTRS = ("actor_network_params", "critic_network_params",
                 "target_actor_network_params", "target_critic_network_params")


def extend_signature(base: Callable[..., Any], own: Callable[..., Any]) -> inspect.Signature:
    """``base``'s signature with ``own``'s extra keyword-only parameters before ``**kwargs``,
    so ``help()`` and ``inspect.signature`` show TorchRL's options and defaults verbatim."""
    params = list(inspect.signature(base).parameters.values())
    names = {p.name for p in params}
    extra = [p for p in inspect.signature(own).parameters.values()
             if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in names]
    var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    fixed = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return inspect.Signature(fixed + extra + var_kw)


def advantage(loss, tensordict: TensorDictBase, *, padded: bool):
    """The (normalised) advantage, running the loss's value estimator when it is missing."""
    kw = {"as_padded_tensor": True} if padded else {}
    adv = tensordict.get(loss.tensor_keys.advantage, None, **kw)
    update_norm = adv is None
    if adv is None:
        if padded and loss.critic_network is None:
            raise RuntimeError(
                "Critic network is not specified, cannot compute advantage within forward.")
        loss.value_estimator(
            tensordict,
            params=loss._cached_critic_network_params_detached,
            target_params=loss.target_critic_network_params,
        )
        adv = tensordict.get(loss.tensor_keys.advantage)
    return loss._maybe_normalize_advantage(adv, tensordict, update_norm=update_norm)


def entropy_and_critic(loss, td_out: TensorDictBase, dist, advantage, tensordict) -> None:
    """Add TorchRL's entropy bonus and critic loss (and their diagnostics) to ``td_out``."""
    if loss.entropy_bonus:
        entropy = loss._get_entropy(dist, adv_shape=advantage.shape[:-1])
        if is_tensor_collection(entropy):
            td_out.set("composite_entropy", entropy.detach())
            td_out.set("entropy", _sum_td_features(entropy).detach().mean())
        else:
            td_out.set("entropy", entropy.detach().mean())
        td_out.set("loss_entropy", loss._weighted_loss_entropy(entropy))
    if loss._has_critic:
        loss_critic, value_clip_fraction, explained_variance = loss.loss_critic(tensordict)
        td_out.set("loss_critic", loss_critic)
        if value_clip_fraction is not None:
            td_out.set("value_clip_fraction", value_clip_fraction)
        if explained_variance is not None:
            td_out.set("explained_variance", explained_variance)


def reduce(loss, td_out: TensorDictBase, tensordict: TensorDictBase) -> TensorDictBase:
    """Reduce every ``loss_*`` entry with the loss's ``reduction`` (and masks), as TorchRL does."""
    return td_out.named_apply(
        lambda name, value: loss._reduce_loss(value, tensordict).squeeze(-1)
        if name.startswith("loss_") else value,
    )


def log_weight_named(loss: Any, tensordict: Any, adv_shape: Any) -> Any:
    """TorchRL's ``loss._log_weight(tensordict, adv_shape=...)``; a shape mismatch in it (a
    log-probability that does not hold one value per sample) is re-raised as the same
    RuntimeError naming each log-probability key it reads and its shape beside the batch's."""
    try:
        return loss._log_weight(tensordict, adv_shape=adv_shape)
    except RuntimeError as e:
        text = str(e)
        if "size of tensor" not in text and "shape" not in text:
            raise
        keys = loss.tensor_keys.sample_log_prob
        keys = keys if isinstance(keys, list) else [keys]
        have = set(tensordict.keys(True, True))
        shapes = ", ".join(f"{k}: {list(tensordict.get(k).shape)}" for k in keys if k in have)
        if not shapes:
            raise
        raise RuntimeError(f"{type(loss).__name__}: the log-probabilities it reads have shapes "
                           f"{shapes}, the batch {list(tensordict.batch_size)}: each must hold "
                           f"one value per sample (summed over the action's features) "
                           f"[{text.splitlines()[0]}]") from e
