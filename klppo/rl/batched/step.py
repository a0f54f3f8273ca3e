"""One PPO minibatch step for many runs at once, and their rollout KLs.

The numpy step (:class:`klppo.nn.numpy.NumpyStep`) for a stack of runs: one stacked forward of
the actors and critics (:func:`klppo.nn.numpy.mlp.forward` over ``[A, n, obs_dim]``); per run,
its own head (:mod:`klppo.nn.numpy.heads`) and its own loss through the core's closed form
(:func:`klppo.nn.numpy.closed_form.loss_grads`: the run's objective, band, KL estimator, beta);
one stacked backward; one :class:`~klppo.nn.numpy.adam.StackedAdam` step (each run's clip norm,
learning rate and moments). Every operation either works on one run's arrays, or is a stacked
product that makes the same BLAS call per run, or is elementwise; so each run gets the numbers
its own :class:`~klppo.nn.numpy.NumpyStep` computes, bit for bit
(``tests/rl/test_batched.py`` compares whole runs).

``rows`` are the stack rows that step (all of them, or the runs still updating when some stopped
early): a subset is gathered into copies and written back after Adam.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from klppo.core.loss import PPOLoss
from klppo.nn.numpy import mlp
from klppo.nn.numpy.closed_form import loss_grads
from klppo.nn.step import StepResult
from klppo.rl.batched.stack import RunStack

__all__ = ["Minibatch", "stacked_step", "stacked_policy_kl", "stacked_act"]

_TERMS = ("loss", "loss_objective", "loss_critic", "loss_entropy", "kl_penalty")


@dataclass
class Minibatch:
    """The rows ``idx [A, n]`` of each stepping run's rollout, gathered: ``obs [A, n, obs_dim]``,
    ``actions [A, n, ...]``, ``params [A, n, param_dim]`` (the rollout policy's), and ``logp``,
    ``adv`` (the advantages the step uses), ``returns``, ``values`` ``[A, n]``."""

    idx: np.ndarray
    obs: np.ndarray
    actions: np.ndarray
    params: np.ndarray
    logp: np.ndarray
    adv: np.ndarray
    returns: np.ndarray
    values: np.ndarray


def _buffers(stack: RunStack, rows: np.ndarray):
    """Weights, gradient, layers and heads of ``rows``: the stack's own when every row steps,
    else gathered copies (written back by the caller)."""
    if len(rows) == stack.R:
        actor, critic, g_actor, g_critic = stack.full()
        return stack.W, stack.G, actor, critic, g_actor, g_critic, [stack.head(r) for r in rows]
    W, lay = stack.W[rows], stack.layout
    G = np.zeros_like(W)
    heads = [lay.head(W[a], G[a]) for a in range(len(rows))]
    return (W, G, *lay.layers(W), *lay.layers(G), heads)


def stacked_step(stack: RunStack, rows: np.ndarray, mb: Minibatch, losses: list[PPOLoss],
                 betas: list[float], ws: mlp.Workspace) -> list[StepResult]:
    """One minibatch step of each run in ``rows`` (its loss ``losses[a]``, its ``betas[a]``);
    each run's :class:`StepResult`, as :meth:`klppo.nn.numpy.NumpyStep.step` returns it."""
    W, G, actor, critic, g_actor, g_critic, heads = _buffers(stack, rows)
    a_acts = mlp.forward(actor, mb.obs, ws, "actor")
    c_acts = mlp.forward(critic, mb.obs, ws, "critic")
    out, values = a_acts[-1], c_acts[-1][..., 0].copy()  # buffers are reused: copy what leaves
    g_out = np.empty(out.shape, np.float32)
    g_val = np.empty(values.shape + (1,), np.float32)
    per_run: list[tuple[Any, ...]] = []
    for a in range(len(rows)):
        logp, entropy, kl, backward = heads[a].step(out[a], mb.actions[a], mb.params[a])
        terms, g_logp, gv, g_ent, g_kl, samples = loss_grads(
            losses[a], logp.astype(np.float32, copy=False), mb.logp[a], mb.adv[a], values[a],
            mb.returns[a], mb.values[a], entropy, kl.astype(np.float32, copy=False), betas[a])
        g_out[a] = backward(g_logp, g_ent, g_kl)
        g_val[a, :, 0] = gv
        per_run.append((logp, entropy, kl, terms, samples))
    mlp.backward(actor, g_actor, a_acts, g_out, ws)
    mlp.backward(critic, g_critic, c_acts, g_val, ws)
    whole = len(rows) == stack.R
    norms = stack.adam.step(G, None if whole else rows, None if whole else W)
    return [StepResult(mb.idx[a], logp, values[a], entropy, kl, mb.adv[a], norms[a],
                       {k: terms[k] for k in _TERMS if k in terms}, samples)
            for a, (logp, entropy, kl, terms, samples) in enumerate(per_run)]


def stacked_policy_kl(stack: RunStack, rows: np.ndarray, obs: np.ndarray,
                      old_params: np.ndarray, ws: mlp.Workspace) -> list[float]:
    """Per run of ``rows``, the mean analytic KL(rollout policy || current policy) over its
    rollout (nats per sample), as :meth:`klppo.nn.numpy.NumpyStep.policy_kl`: ``obs [A, B,
    obs_dim]`` and ``old_params [A, B, param_dim]`` are the rows' rollouts."""
    W, _, actor, _, _, _, heads = _buffers(stack, rows)
    out = mlp.forward(actor, obs, ws, "actor")[-1]
    return [heads[a].kl_mean(out[a], old_params[a]) for a in range(len(rows))]


def stacked_act(stack: RunStack, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The actors' outputs ``[R, N, k or d]`` and values ``[R, N]`` of every row for
    ``obs [R, N, obs_dim]``, as each run's rollout runner computes them
    (:meth:`klppo.nn.numpy.NumpyRunner.act`, before sampling)."""
    actor, critic = stack.full()[:2]
    return mlp.forward(actor, obs)[-1], mlp.forward(critic, obs)[-1][..., 0]
