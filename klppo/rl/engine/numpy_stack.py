"""The numpy stack: R policies' networks as float32 ``W [R, P]``, and their one minibatch step.

Row r is policy r's flat weight buffer (:func:`klppo.nn.numpy.weights.flat_weights` on that
row): its torch parameters view it, so its checkpoint, its rollout runner and the stacked forward
read the same numbers. A policy joins through :meth:`NumpyStack.maker` when its
:class:`~klppo.rl.unit.PolicyUnit` is built; its learner then holds a :class:`NumpySlot`.

:meth:`NumpyStack.step` is THE numpy minibatch step (a plain run is a stack of one): one stacked
forward of the actors and critics (:func:`klppo.nn.numpy.mlp.forward` over ``[A, n,
obs_dim]``); per policy, its own head (:mod:`klppo.nn.numpy.heads`) and its own loss through the
core's closed form (:func:`klppo.nn.numpy.closed_form.loss_grads`: its objective, band, KL
estimator, beta); one stacked backward; one :class:`~klppo.nn.numpy.adam.NumpyAdam` step (each
row's clip norm, learning rate and moments). Every operation works on one policy's arrays, or is
a stacked product that makes the same BLAS call per row, or is elementwise, so a policy's numbers
do not depend on the rows beside it (``tests/rl/test_engine.py`` compares whole runs grouped and
alone). ``tests/nn/numpy/test_step.py`` holds the step to torch autograd for every objective.
``rows`` are the rows that step (all of them, or those still updating when some stopped early):
a subset is gathered into copies and written back after Adam.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from klppo.core.kl import k3
from klppo.core.loss import PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.numpy import FastPathUnsupported, fast_path_refusal, flat_weights, mlp
from klppo.nn.numpy.adam import NumpyAdam
from klppo.nn.numpy.closed_form import loss_grads
from klppo.nn.numpy.heads import Categorical, Gaussian
from klppo.nn.step import StepResult
from klppo.rl.config import PPOConfig
from klppo.rl.engine.rows import TERMS, Layout, Minibatch, RowSlot, loss_families, seat_row
from klppo.rl.engine.steplog import StepLog

__all__ = ["NumpyStack", "NumpySlot"]


Layer = tuple[np.ndarray, np.ndarray]
Head = Categorical | Gaussian


class NumpySlot(RowSlot):
    """Policy r's backend in a numpy stack (see :class:`RowSlot`); ``weights`` is its row, the
    buffer its rollout runner acts with."""

    fast = True
    device = torch.device("cpu")

    def __init__(self, stack: NumpyStack, row: int, agent: ActorCritic, loss: PPOLoss,
                 weights: Any) -> None:
        self.stack, self.row, self.agent, self.loss = stack, row, agent, loss
        self.weights = weights


class NumpyStack:
    """R networks of one shape stacked row by row (see the module docstring)."""

    fast = True
    device = torch.device("cpu")
    #: the weights, their gradient, Adam and the rows' layout: made when the first row joins
    W: np.ndarray
    G: np.ndarray
    adam: NumpyAdam
    layout: Layout

    def __init__(self, runs: int) -> None:
        self.R = runs
        self.slots: list[NumpySlot | None] = [None] * runs
        self._rows: dict[int, tuple[Any, ...]] = {}
        self._full: tuple[list[Layer], ...] | None = None
        self._heads: list[Head | None] = [None] * runs

    def maker(self, row: int, ppo: PPOConfig) -> Callable[[ActorCritic, PPOLoss], NumpySlot]:
        """The ``make_step`` of the policy in row ``row`` (:class:`klppo.rl.unit.PolicyUnit`)."""
        return lambda agent, loss: self._join(row, agent, loss, ppo)

    def _join(self, row: int, agent: ActorCritic, loss: PPOLoss, ppo: PPOConfig) -> NumpySlot:
        why = fast_path_refusal(agent, loss)
        if why is not None:
            raise FastPathUnsupported(f"the numpy fast path cannot run this: {why}")
        total = sum(p.numel() for p in agent.parameters())
        if not hasattr(self, "W"):  # the first row to join
            self.W = np.zeros((self.R, total), np.float32)
            self.G = np.zeros_like(self.W)
            self.adam = NumpyAdam(self.W, np.full(self.R, ppo.lr), np.full(self.R, ppo.adam_eps),
                                  np.full(self.R, ppo.max_grad_norm))
        weights = flat_weights(agent, self.W[row])
        seat_row(self, row, Layout(agent, weights.span), ppo)
        slot = self.slots[row] = NumpySlot(self, row, agent, loss, weights)
        return slot

    # ------------------------------------------------------------------ views
    def _all(self) -> tuple[list[Layer], ...]:
        """Stacked layers of every row: actor, critic, and their gradients' (views, cached)."""
        if self._full is None:
            self._full = (*self.layout.layers(self.W), *self.layout.layers(self.G))
        return self._full

    def _head(self, weights: np.ndarray, grad: np.ndarray | None) -> Head:
        if self.layout.log_std is None:
            return Categorical()
        s, e = self.layout.log_std
        return Gaussian(weights[s:e], None if grad is None else grad[s:e])

    def head(self, row: int) -> Head:
        """Row ``row``'s action head on the stack's own weights and gradient (cached)."""
        h = self._heads[row]
        if h is None:
            h = self._heads[row] = self._head(self.W[row], self.G[row])
        return h

    def _buffers(self, rows: np.ndarray) -> tuple[Any, ...]:
        """Weights, gradient, layers and heads of ``rows``: the stack's own when every row
        steps; one row's own views (2-D layers: the network alone, without the stacked loop's
        overhead) when one steps; else gathered copies (written back by the caller)."""
        if len(rows) == self.R and self.R > 1:
            return (self.W, self.G, *self._all(), [self.head(r) for r in rows])
        if len(rows) == 1:
            return self._alone(int(rows[0]))
        W = self.W[rows]
        G = np.zeros_like(W)
        heads = [self._head(W[a], G[a]) for a in range(len(rows))]
        return (W, G, *self.layout.layers(W), *self.layout.layers(G), heads)

    def _alone(self, r: int) -> tuple[Any, ...]:
        """Row ``r``'s weights and gradient ``[1, P]`` and its 2-D layers (cached)."""
        got = self._rows.get(r)
        if got is None:
            W, G = self.W[r:r + 1], self.G[r:r + 1]
            layers = (*self.layout.layers(W), *self.layout.layers(G))
            got = self._rows[r] = (W, G, *([(w[0], b[0]) for w, b in ls] for ls in layers),
                                   [self.head(r)])
        return got

    # ------------------------------------------------------------------ the step
    def step(self, rows: np.ndarray, mb: Minibatch, losses: list[PPOLoss], betas: list[float],
             ws: mlp.Workspace, log: StepLog | None = None) -> list[StepResult]:
        """One minibatch step of each policy in ``rows`` (its loss ``losses[a]``, its
        ``betas[a]``); per policy its detached per-sample outputs (numpy) and loss terms, also
        written to ``log`` when given (one assignment per quantity for the rows that share
        it)."""
        W, G, actor, critic, g_actor, g_critic, heads = self._buffers(rows)
        alone = len(rows) == 1  # 2-D layers: the row's network alone
        x = mb.obs[0] if alone else mb.obs
        a_acts = mlp.forward(actor, x, ws, "actor")
        c_acts = mlp.forward(critic, x, ws, "critic")
        out = a_acts[-1][None] if alone else a_acts[-1]
        values = c_acts[-1][..., 0].copy()  # buffers are reused: copy what leaves
        values = values[None] if alone else values
        g_out = np.empty(out.shape, np.float32)
        g_val = np.empty(values.shape + (1,), np.float32)
        per_row: list[Any] = [None] * len(rows)
        at: tuple[Any, Any] = (None, 0) if log is None else log.at(rows)
        for family in loss_families(losses):
            if len(family) == 1:
                a = family[0]
                per_row[a] = self._loss(heads[a], a, out, values, mb, losses[a], betas[a],
                                        g_out, g_val)
                if log is not None:
                    _log_one(log, log.part(at, slice(a, a + 1)), per_row[a])
            else:
                self._family_loss(family, W, G, out, values, mb, losses[family[0]], betas,
                                  g_out, g_val, per_row,
                                  None if log is None else (log, at))
        mlp.backward(actor, g_actor, a_acts, g_out[0] if alone else g_out, ws)
        mlp.backward(critic, g_critic, c_acts, g_val[0] if alone else g_val, ws)
        whole = len(rows) == self.R
        norms = self.adam.step(G, None if whole else rows, None if whole else W)
        if log is not None:
            for name, x in (("values", values), ("adv", mb.adv), ("logp_old", mb.logp),
                            ("grad_norm", norms)):
                log.put(at, name, x)
            log.advance(rows)
        return [StepResult(mb.idx[a], logp, values[a], entropy, kl, mb.adv[a], norms[a], terms,
                           samples)
                for a, (logp, entropy, kl, terms, samples) in enumerate(per_row)]

    @staticmethod
    def _loss(head: Head, a: int, out: np.ndarray, values: np.ndarray, mb: Minibatch,
              loss: PPOLoss, beta: float, g_out: np.ndarray, g_val: np.ndarray) -> tuple:
        """Policy ``a``'s head and closed-form loss alone; writes its output gradients."""
        logp, entropy, kl, backward = head.step(out[a], mb.actions[a], mb.params[a])
        terms, g_logp, gv, g_ent, g_kl, samples = loss_grads(
            loss, logp.astype(np.float32, copy=False), mb.logp[a], mb.adv[a], values[a],
            mb.returns[a], mb.values[a], entropy, kl.astype(np.float32, copy=False), beta,
            None if mb.weight is None else mb.weight[a])
        g_out[a] = backward(g_logp, g_ent, g_kl)
        g_val[a, :, 0] = gv
        return logp, entropy, kl, {k: terms[k] for k in TERMS if k in terms}, samples

    def _family_loss(self, family: list[int], W: np.ndarray, G: np.ndarray, out: np.ndarray,
                     values: np.ndarray, mb: Minibatch, loss: PPOLoss, betas: list[float],
                     g_out: np.ndarray, g_val: np.ndarray, per_row: list[Any],
                     log: tuple[StepLog, tuple[Any, Any]] | None) -> None:
        """The heads and closed-form losses of the policies ``family`` (positions in the step,
        one loss setting but beta) as one ``[F, n]`` computation; each row's numbers are those
        it computes alone (``tests/rl/test_engine.py``). ``log``: the step log and the step's
        index in it (:meth:`StepLog.at`), where the family's outputs go."""
        first, F = family[0], len(family)
        sel: Any = (slice(first, first + F) if family == list(range(first, first + F))
                    else np.array(family))  # positions side by side: views, not copies
        o, acts, params = out[sel], mb.actions[sel], mb.params[sel]
        F, n = o.shape[:2]
        if self.layout.log_std is None:  # categorical: every quantity is per sample
            flat = Categorical().step(o.reshape(F * n, -1), acts.reshape(F * n),
                                      params.reshape(F * n, -1))
            logp, entropy, kl = (v.reshape(F, n) for v in flat[:3])

            def backward(g_logp, g_ent, g_kl):
                return flat[3](g_logp.reshape(-1), None if g_ent is None else g_ent.reshape(-1),
                               None if g_kl is None else g_kl.reshape(-1)).reshape(F, n, -1)
        else:
            s, e = self.layout.log_std
            g_log_std = np.zeros((F, 1, e - s), np.float32)
            logp, entropy, kl, backward = Gaussian(W[sel, s:e][:, None], g_log_std).step(
                o, acts, params)
        beta = np.array([betas[a] for a in family], np.float64)[:, None]
        terms, g_logp, gv, g_ent, g_kl, samples = loss_grads(
            loss, logp.astype(np.float32, copy=False), mb.logp[sel], mb.adv[sel], values[sel],
            mb.returns[sel], mb.values[sel], entropy, kl.astype(np.float32, copy=False), beta,
            None if mb.weight is None else mb.weight[sel])
        g_out[sel] = backward(g_logp, g_ent, g_kl)
        if self.layout.log_std is not None:
            G[sel, s:e] = g_log_std[:, 0]
        g_val[sel, :, 0] = gv
        names = [k for k in TERMS if k in terms]  # each row's terms, as floats, in TERMS order
        if log is not None:
            step_log, at = log
            at = step_log.part(at, sel)
            for name, x in (("logp", logp), ("entropy", entropy), ("kl", kl),
                            *((k, terms[k]) for k in names), *samples.items()):
                step_log.put(at, name, x)
        row_terms = zip(*(terms[k].tolist() for k in names))
        row_samples = zip(*samples.values())
        for a, lp, ent, k, t, smp in zip(family, logp, entropy, kl, row_terms, row_samples):
            per_row[a] = (lp, ent, k, dict(zip(names, t)), dict(zip(samples, smp)))

    def policy_kl(self, rows: np.ndarray, obs: np.ndarray, old_params: np.ndarray,
                  ws: mlp.Workspace) -> list[float]:
        """Per row of ``rows``, the mean analytic KL(rollout policy || current policy) over its
        rollout (nats per sample): ``obs [A, B, obs_dim]`` and ``old_params [A, B,
        param_dim]`` are the rows' rollouts."""
        _, _, actor, _, _, _, heads = self._buffers(rows)
        if len(rows) == 1:  # 2-D layers: the row's network alone
            out = mlp.forward(actor, obs[0], ws, "actor")[-1][None]
        else:
            out = mlp.forward(actor, obs, ws, "actor")[-1]
        return [heads[a].kl_mean(out[a], old_params[a]) for a in range(len(rows))]

    def probe_k3(self, rows: np.ndarray, idx: np.ndarray, mb: Minibatch) -> list[float]:
        """Per row of ``rows``, the mean k3 KL(rollout || current policy) on its minibatch
        ``mb`` (sample indices ``idx``), before stepping on it: SB3's ``approx_kl``, from the
        forward and log-probabilities the step computes for it (one stacked actor forward)."""
        W, _, actor, *_ = self._buffers(rows)
        if len(rows) == 1:  # 2-D layers: the row's network alone, as its step computes it
            out = mlp.forward(actor, mb.obs[0])[-1][None]
        else:
            out = mlp.forward(actor, mb.obs)[-1]
        A, n = out.shape[:2]
        if self.layout.log_std is None:  # every quantity per sample: the rows as one
            logp = Categorical().log_prob(out.reshape(A * n, -1),
                                          mb.actions.reshape(A * n)).reshape(A, n)
        else:
            s, e = self.layout.log_std
            logp = Gaussian(W[:, None, s:e]).log_prob(out, mb.actions)
        # each row's mean over its own samples (the same pairwise sum as the row alone)
        return cast(np.ndarray, k3(logp - mb.logp)).mean(axis=-1).tolist()

    def log_prob(self, row: int, obs: np.ndarray, actions: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s distribution parameters ``[B, param_dim]`` (as its rollouts store
        them) and log-probabilities ``[B]`` of ``actions`` at ``obs [B, obs_dim]``: the numbers
        its minibatch step computes for them."""
        actor = self._alone(row)[2]
        out = mlp.forward(actor, obs)[-1]
        head = self.head(row)
        logp = head.log_prob(out, actions)
        if isinstance(head, Gaussian):
            out = np.concatenate([out, np.broadcast_to(head.log_std, out.shape)], 1)
        return out, logp.astype(np.float32, copy=False)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The actors' outputs ``[R, N, k or d]`` and values ``[R, N]`` of every row for
        ``obs [R, N, obs_dim]``, as each row's rollout runner computes them
        (:meth:`klppo.nn.numpy.NumpyRunner.act`, before sampling)."""
        if self.R == 1:  # the network alone (no stacked loop)
            actor, critic = self._alone(0)[2:4]
            x = obs[0]
            return mlp.forward(actor, x)[-1][None], mlp.forward(critic, x)[-1][None, :, 0]
        actor, critic = self._all()[:2]
        return mlp.forward(actor, obs)[-1], mlp.forward(critic, obs)[-1][..., 0]


def _log_one(log: StepLog, at: tuple[Any, Any], row: tuple) -> None:
    """A policy's outputs of its own loss (:meth:`NumpyStack._loss`) to the step log."""
    logp, entropy, kl, terms, samples = row
    for name, x in (("logp", logp), ("entropy", entropy), ("kl", kl), *samples.items()):
        log.put(at, name, np.asarray(x)[None])
    for name, v in terms.items():
        log.put(at, name, [v])
