"""Fast path of the PPO minibatch step for ``ActorCritic`` with separate tanh MLPs.

On a small CPU network each torch call costs several microseconds and the autograd engine adds
more per node, so a 2x64 actor-critic step is dominated by overhead. This path splits the step:

1. numpy forward of both MLPs and the action head (log-prob, entropy, analytic KL to the
   rollout policy);
2. the loss gradient per sample, in closed form through the KLip-PPO template: for every
   objective of the family, d objective / d logp_new = w A + beta_t (beta_t from the core's own
   shapes, :func:`klppo.core.surrogates.per_sample_beta`), minus beta dKL/dlogp_new for the
   scalar penalties; the value and entropy terms likewise (``_loss_grads``). The same
   :class:`~klppo.core.loss.PPOLoss` settings drive it, and the tests compare it with autograd
   on ``PPOLoss`` for every objective and value-loss kind;
3. numpy backward through the head and the MLPs into one flat gradient buffer;
4. global-norm clip and Adam on the flat buffer, which the torch parameters are views of.

``tests/nn/test_fastpath.py`` checks it against torch autograd + ``torch.optim.Adam``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from klppo.core.advantages import normalize_advantage
from klppo.core.loss import PPOLoss
from klppo.core.values import value_loss_closed_form
from klppo.nn._rowops import col_sum, row_max, row_sum
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.distributions import CategoricalHead

__all__ = ["flatten_parameters", "FastStep", "supports_fast_path", "fast_path_refusal",
           "FastPathUnsupported"]

_HALF_LOG_2PI = np.float32(0.5 * np.log(2 * np.pi))


def supports_fast_path(agent: ActorCritic) -> bool:
    """Separate MLPs made of Linear layers with Tanh between them, no shared trunk."""
    def ok(seq: nn.Sequential) -> bool:
        mods = list(seq)
        return (len(mods) % 2 == 1 and all(isinstance(m, nn.Linear) for m in mods[::2])
                and all(isinstance(m, nn.Tanh) for m in mods[1::2]))
    return agent.trunk is None and ok(agent.actor) and ok(agent.critic)


class FastPathUnsupported(ValueError):
    """The fast path cannot serve this network or objective; the message says why."""


def fast_path_refusal(agent: ActorCritic, loss: PPOLoss) -> str | None:
    """Why the numpy fast path cannot run this agent and loss exactly, or None when it can."""
    if not supports_fast_path(agent):
        return "the network is not two separate Linear/Tanh MLPs (a shared trunk?)"
    if not loss.policy.has_closed_form:
        return (f"objective {loss.objective!r} has no closed-form derivative "
                f"(klppo.core.objectives.Objective.closed_form)")
    if not loss.policy.band.is_scalar:
        return "per-sample (tensor) clip bands are not supported by the fast path"
    return None


def flatten_parameters(module: nn.Module) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Move every float32 parameter into one contiguous buffer (parameters become views).

    Returns the flat numpy array and each parameter's (start, end) slice, in
    ``module.parameters()`` order. Values are unchanged; in-place loads (``load_state_dict``)
    keep the views valid.
    """
    params = list(module.parameters())
    total = sum(p.numel() for p in params)
    flat = np.empty(total, np.float32)
    spans, at = [], 0
    for p in params:
        n = p.numel()
        flat[at:at + n] = p.detach().numpy().reshape(-1)
        p.data = torch.from_numpy(flat[at:at + n]).view(p.shape)
        spans.append((at, at + n))
        at += n
    return flat, spans


class FastStep:
    """One minibatch step: forward, loss, backward, clip, Adam, all in place."""

    def __init__(self, agent: ActorCritic, loss: PPOLoss, lr: float, eps: float,
                 max_norm: float, flat: np.ndarray, spans: list[tuple[int, int]]) -> None:
        why = fast_path_refusal(agent, loss)
        if why is not None:
            raise FastPathUnsupported(f"the numpy fast path cannot run this: {why}")
        self.agent, self.loss = agent, loss
        self.lr, self.eps, self.max_norm = lr, eps, max_norm
        self.flat = flat
        self.grad = np.zeros_like(flat)
        self.m = np.zeros_like(flat)
        self.v = np.zeros_like(flat)
        self._adam_tmp, self._adam_denom = np.empty_like(flat), np.empty_like(flat)
        self.t = 0
        index = {id(p): i for i, p in enumerate(agent.parameters())}

        def layers(seq: nn.Sequential):
            out = []
            for m in list(seq)[::2]:
                (ws, we), (bs, be) = spans[index[id(m.weight)]], spans[index[id(m.bias)]]
                out.append((flat[ws:we].reshape(m.weight.shape), flat[bs:be],
                            self.grad[ws:we].reshape(m.weight.shape), self.grad[bs:be]))
            return out

        self.actor, self.critic = layers(agent.actor), layers(agent.critic)
        self._bufs: dict[tuple, np.ndarray] = {}
        self.categorical = isinstance(agent.head, CategoricalHead)
        if not self.categorical:
            s, e = spans[index[id(agent.log_std)]]
            self.log_std, self.g_log_std = flat[s:e], self.grad[s:e]

    def set_lr(self, lr: float) -> None:
        self.lr = float(lr)

    def _buf(self, key: tuple, shape: tuple[int, ...]) -> np.ndarray:
        """A reusable float32 work array: temporaries of minibatch size would otherwise cost
        an allocation (and page faults) each, several times the arithmetic at 2048 samples.
        Backward temporaries are shared by both networks (a smaller working set in cache)."""
        k = (key, shape)
        b = self._bufs.get(k)
        if b is None:
            b = self._bufs[k] = np.empty(shape, np.float32)
        return b

    def _rows(self, n: int) -> np.ndarray:
        r = self._bufs.get(("rows", n))
        if r is None:
            r = self._bufs[("rows", n)] = np.arange(n)
        return r

    def _forward(self, layers, x, tag: str):
        acts = [x]
        for k, (w, b, _, _) in enumerate(layers):
            out = self._buf((tag, "a", k), (x.shape[0], w.shape[0]))
            np.matmul(x, w.T, out=out)
            np.add(out, b, out=out)
            if k < len(layers) - 1:
                np.tanh(out, out=out)
            acts.append(out)
            x = out
        return acts

    def _backward(self, layers, acts, g, tag: str) -> None:
        n = g.shape[0]
        for k in range(len(layers) - 1, -1, -1):
            w, _, gw, gb = layers[k]
            np.matmul(g.T, acts[k], out=gw)
            # numpy's row-after-row order, not ones @ g (faster still): the summation order
            # changes the rounding and with it whole trajectories; the learning numbers were
            # measured with this one
            col_sum(g, gb)
            if k:
                gn = self._buf(("g", k % 2), (n, w.shape[1]))  # k % 2: never the input g
                if w.shape[0] == 1:  # one output: an outer product (one rounding, as in
                    np.einsum("i,j->ij", g[:, 0], w[0], out=gn)  # BLAS), 4x faster
                else:
                    np.matmul(g, w, out=gn)
                tmp = self._buf(("t",), gn.shape)
                np.multiply(acts[k], acts[k], out=tmp)
                np.subtract(1.0, tmp, out=tmp)
                np.multiply(gn, tmp, out=gn)
                g = gn

    def step(self, obs, actions, old_params, logp_old, adv, returns, old_values, beta,
             want_entropy_grad: bool, want_kl_grad: bool) -> dict[str, Any]:
        """Apply one update; return per-sample outputs (numpy arrays) and the loss terms and
        the pre-clip gradient norm (floats)."""
        a_acts = self._forward(self.actor, obs, "actor")
        c_acts = self._forward(self.critic, obs, "critic")
        out, value = a_acts[-1], c_acts[-1][:, 0].copy()  # buffers are reused: copy what leaves
        head = self._categorical if self.categorical else self._gaussian
        logp, entropy, kl, backward = head(out, actions, old_params)
        terms, g_logp, g_val, g_ent, g_kl = _loss_grads(
            self.loss, logp.astype(np.float32, copy=False), logp_old, adv, value, returns,
            old_values, entropy, kl.astype(np.float32, copy=False), beta)
        g_out = backward(g_logp, g_ent, g_kl)
        self._backward(self.actor, a_acts, g_out.astype(np.float32, copy=False), "actor")
        self._backward(self.critic, c_acts, np.ascontiguousarray(g_val[:, None]), "critic")
        norm = self._clip_and_adam()
        return {"logp": logp, "values": value, "entropy": entropy, "kl": kl, "grad_norm": norm,
                **terms}

    def _categorical(self, out, actions, old_params):
        """Log-prob, entropy and KL(old || new) of softmax logits, and their backward."""
        z = out - row_max(out)
        ez = np.exp(z)
        s = row_sum(ez)
        logp_all = z - np.log(s)
        p = ez / s
        rows = self._rows(out.shape[0])
        logp = logp_all[rows, actions]
        entropy = -row_sum(p * logp_all)[:, 0]
        zo = old_params - row_max(old_params)
        logp_old_all = zo - np.log(row_sum(np.exp(zo)))
        p_old = np.exp(logp_old_all)
        kl = row_sum(p_old * (logp_old_all - logp_all))[:, 0]

        def backward(g_logp, g_ent, g_kl):
            g_out = -g_logp[:, None] * p
            g_out[rows, actions] += g_logp
            if g_ent is not None:
                g_out -= g_ent[:, None] * p * (logp_all + entropy[:, None])
            if g_kl is not None:
                g_out += g_kl[:, None] * (p - p_old)
            return g_out

        return logp, entropy, kl, backward

    def _gaussian(self, out, actions, old_params):
        """The same for a diagonal Gaussian with a state-independent log-std (its gradient goes
        straight into the flat buffer)."""
        n, d = out.shape
        log_std = self.log_std
        inv_std = np.exp(-log_std)
        zz = (actions - out) * inv_std
        logp = (-0.5 * zz * zz - log_std - _HALF_LOG_2PI).sum(1)
        entropy = np.full(n, (log_std + 0.5 + _HALF_LOG_2PI).sum(), np.float32)
        mo, lso = old_params[:, :d], old_params[:, d:]
        var_ratio = np.exp(2 * (lso - log_std))
        diff = mo - out
        kl = 0.5 * (var_ratio + diff * diff * inv_std**2 - 1 - 2 * (lso - log_std)).sum(1)

        def backward(g_logp, g_ent, g_kl):
            g_out = g_logp[:, None] * zz * inv_std
            g_ls = (g_logp[:, None] * (zz * zz - 1)).sum(0)
            if g_ent is not None:
                g_ls += g_ent.sum()
            if g_kl is not None:
                g_out -= g_kl[:, None] * diff * inv_std**2
                g_ls += (g_kl[:, None] * (1 - var_ratio - diff * diff * inv_std**2)).sum(0)
            self.g_log_std[:] = g_ls
            return g_out

        return logp, entropy, kl, backward

    def _clip_and_adam(self) -> float:
        """Global-norm clip and Adam on the flat buffers, in place; the pre-clip norm."""
        g = self.grad
        norm = float(np.sqrt(np.dot(g, g)))
        coef = self.max_norm / (norm + 1e-6)
        if coef < 1.0:
            g *= np.float32(coef)
        self.t += 1
        b1, b2 = 0.9, 0.999
        t, denom = self._adam_tmp, self._adam_denom  # the textbook expressions, in place
        self.m *= b1
        np.multiply(g, 1 - b1, out=t)
        self.m += t                                   # m = b1 m + (1 - b1) g
        self.v *= b2
        np.multiply(g, 1 - b2, out=t)
        np.multiply(t, g, out=t)
        self.v += t                                   # v = b2 v + (1 - b2) g g
        np.sqrt(self.v, out=denom)
        np.divide(denom, np.float32(np.sqrt(1 - b2**self.t)), out=denom)
        denom += np.float32(self.eps)
        np.multiply(self.m, np.float32(self.lr / (1 - b1**self.t)), out=t)
        np.divide(t, denom, out=t)
        self.flat -= t                                # p -= lr_t m / (sqrt(v_hat) + eps)
        return norm

    def policy_kl(self, obs: np.ndarray, old_params: np.ndarray) -> float:
        """Mean analytic KL(old || current) over ``obs`` (nats per sample), numpy forward."""
        out = self._forward(self.actor, obs, "actor")[-1]
        if self.categorical:
            z = out - row_max(out)
            logp = z - np.log(row_sum(np.exp(z)))
            zo = old_params - row_max(old_params)
            lo = zo - np.log(row_sum(np.exp(zo)))
            return float(row_sum(np.exp(lo) * (lo - logp))[:, 0].mean())
        d = out.shape[1]
        mo, lso = old_params[:, :d], old_params[:, d:]
        ls = self.log_std
        kl = 0.5 * (np.exp(2 * (lso - ls)) + (mo - out) ** 2 * np.exp(-2 * ls) - 1
                     - 2 * (lso - ls)).sum(1)
        return float(kl.mean())

    def state_dict(self) -> dict[str, Any]:
        """Adam state (the parameters themselves live in the model's state_dict)."""
        return {"lr": self.lr, "m": self.m.copy(), "v": self.v.copy(), "t": self.t}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.lr, self.t = float(s["lr"]), int(s["t"])
        self.m[:] = s["m"]
        self.v[:] = s["v"]


def _mean(x: np.ndarray) -> float:
    """``float(x.mean())`` for a 1-D float array, bit for bit (numpy sums pairwise, divides in
    double and rounds to the array's type), without ``np.mean``'s Python-level overhead."""
    return float(x.dtype.type(float(np.add.reduce(x)) / x.shape[0]))


def _loss_grads(loss: PPOLoss, logp, logp_old, adv, value, returns, old_values, entropy, kl,
                beta: float):
    """Loss terms and d loss / d (logp_new, value, entropy, analytic KL) per sample.

    The policy part is the objective's own closed form
    (:meth:`klppo.core.objectives.Objective.closed_form`), the critic part the value loss's
    (:func:`klppo.core.values.value_loss_closed_form`). Gradients of the *loss* (minimised) are
    returned, averaged over the ``n`` samples like ``PPOLoss``.
    """
    n = logp.shape[0]
    inv_n = np.float32(1.0 / n)
    a = normalize_advantage(adv) if loss.normalize_advantage == "minibatch" else adv
    log_w = logp - logp_old
    w = np.exp(log_w)
    form = loss.policy.closed_form(w, a, w * a, logp, log_w, kl, beta)
    terms: dict[str, float] = {}
    if form.penalty is not None:
        terms["kl_penalty"] = _mean(form.penalty)
    g_logp = (-inv_n * form.d_logp).astype(np.float32)
    g_kl = None if form.d_kl is None else -inv_n * form.d_kl
    v_loss, g_v = value_loss_closed_form(value, returns, old_values, loss.value_clip,
                                         loss.value_loss_kind)
    g_val = (np.float32(loss.vf_coef) * inv_n * g_v).astype(np.float32)
    # no entropy bonus: no entropy gradient (adding its zeros would change nothing)
    g_ent = (np.full(n, -np.float32(loss.ent_coef) * inv_n, np.float32) if loss.ent_coef
             else None)
    loss_obj = -_mean(form.value)
    loss_critic = loss.vf_coef * _mean(v_loss)
    loss_ent = -loss.ent_coef * _mean(entropy)
    terms.update(loss_objective=loss_obj, loss_critic=loss_critic, loss_entropy=loss_ent,
                 loss=loss_obj + loss_critic + loss_ent)
    return terms, g_logp, g_val, g_ent, g_kl
