"""One PPO minibatch step for many torch runs at once (any device), and their rollout KLs.

:class:`klppo.rl.backends.TorchStep` for a :class:`~klppo.rl.batched.torch_stack.TorchRunStack`:
one stacked forward of the actors and critics (``baddbmm`` over ``[A, n, obs_dim]``, tanh
between layers); per run, its own head (log-probability, entropy, analytic KL) and its own
:class:`~klppo.core.loss.PPOLoss` (its objective, band, estimator, beta), exactly the calls
``TorchStep.step`` makes; one backward of the runs' summed losses (the runs share no parameter,
so each row's gradient is its own loss's); one :class:`StackedAdam` step. The functions have the
signatures of :mod:`klppo.rl.batched.step` (the numpy stack's) so the engine calls either.

The stacked product is not the ordinary engine's ``addmm`` and rounds differently in the last
bits, so a run here is not bit for bit its ordinary torch run (``tests/rl/test_batched_torch.py``
bounds the difference).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from klppo.core.loss import PER_SAMPLE, PPOLoss
from klppo.nn.step import StepResult
from klppo.rl.batched.step import Minibatch
from klppo.rl.batched.torch_stack import TorchRunStack

__all__ = ["stacked_step", "stacked_policy_kl", "stacked_act"]

_TERMS = ("loss", "loss_objective", "loss_critic", "loss_entropy", "kl_penalty")


def _forward(layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
    """The stacked tanh MLP: ``x [A, n, in]`` through layers ``(W [A, out, in], b [A, out])``."""
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        x = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
        if i < last:
            x = torch.tanh(x)
    return x


def _nets(stack: TorchRunStack, W: torch.Tensor, obs: torch.Tensor, critic: bool = True):
    """Distribution parameters ``[A, n, param_dim]`` (the actor's output, and the log-std of
    each row for a Gaussian head) and values ``[A, n]`` of the rows of ``W`` for ``obs``."""
    actor_layers, critic_layers = stack.layout.layers(W)
    out = _forward(actor_layers, obs)
    if stack.layout.log_std is not None:
        s, e = stack.layout.log_std
        out = torch.cat([out, W[:, None, s:e].expand(-1, out.shape[1], -1)], -1)
    values = _forward(critic_layers, obs)[..., 0] if critic else None
    return out, values


def _dev(x: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu()


def stacked_step(stack: TorchRunStack, rows: np.ndarray, mb: Minibatch, losses: list[PPOLoss],
                 betas: list[float], ws: Any = None) -> list[StepResult]:
    """One minibatch step of each run in ``rows``; each run's :class:`StepResult` as
    :meth:`TorchStep.step` returns it (detached, on the CPU). ``ws`` is unused (the numpy
    stack's workspace)."""
    dev, slots = stack.device, [stack.slots[r] for r in rows]
    r_idx = torch.as_tensor(rows, device=dev)
    f = {k: _dev(getattr(mb, k), dev) for k in ("obs", "actions", "params", "logp", "adv",
                                                "returns", "values")}
    # one row steps alone: pad it with a copy that has no loss, since torch's bmm backward
    # for a batch of one rounds otherwise than for two or more (a run's numbers would then
    # depend on how many runs step beside it)
    lone = len(rows) == 1
    W = stack.W[r_idx.repeat(2) if lone else r_idx].requires_grad_(True)  # the leaf: a copy
    params, values = _nets(stack, W, f["obs"].repeat(2, 1, 1) if lone else f["obs"])
    total, outs = W.new_zeros(()), []
    for a, (slot, loss) in enumerate(zip(slots, losses)):
        head, needs_kl = slot.head, loss.needs_analytic_kl
        logp = head.log_prob(params[a], f["actions"][a])
        with torch.set_grad_enabled(loss.ent_coef > 0):
            entropy = head.entropy(params[a])
        with torch.set_grad_enabled(needs_kl):
            kl = head.kl(f["params"][a], params[a])
        out = loss(logp, f["logp"][a], f["adv"][a], values[a], f["returns"][a], f["values"][a],
                   entropy, kl if needs_kl else None, betas[a], diagnostics=False,
                   per_sample=True)
        total = total + out["loss"]
        outs.append((logp, entropy, kl, out))
    (G,) = torch.autograd.grad(total, W)
    norms = stack.adam.step(stack.W, G[:len(rows)], r_idx)
    results = []
    for a, (logp, entropy, kl, out) in enumerate(outs):
        terms = {k: _cpu(out[k]) for k in _TERMS if k in out}
        samples = {k: _cpu(out[f"per_sample/{k}"]) for k in PER_SAMPLE
                   if f"per_sample/{k}" in out}
        results.append(StepResult(torch.from_numpy(mb.idx[a]), _cpu(logp), _cpu(values[a]),
                                  _cpu(entropy), _cpu(kl), _cpu(f["adv"][a]), _cpu(norms[a]),
                                  terms, samples))
    return results


@torch.no_grad()
def stacked_policy_kl(stack: TorchRunStack, rows: np.ndarray, obs: np.ndarray,
                      old_params: np.ndarray, ws: Any = None) -> list[float]:
    """Per run of ``rows``, the mean analytic KL(rollout policy || current policy) over its
    rollout (nats per sample), as :meth:`TorchStep.policy_kl`."""
    dev = stack.device
    W = stack.W[torch.as_tensor(rows, device=dev)]
    params, _ = _nets(stack, W, _dev(obs, dev), critic=False)
    old = _dev(old_params, dev)
    return [float(stack.slots[r].head.kl(old[a], params[a]).mean()) for a, r in enumerate(rows)]


@torch.inference_mode()
def stacked_act(stack: TorchRunStack, obs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The distribution parameters ``[R, N, param_dim]`` and values ``[R, N]`` of every row for
    ``obs [R, N, obs_dim]``, on the stack's device, as each run's :class:`TorchRunner` computes
    them before sampling (:meth:`TorchRunner.sample` draws from them)."""
    return _nets(stack, stack.W, _dev(obs, stack.device))
