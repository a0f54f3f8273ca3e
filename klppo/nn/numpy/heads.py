"""The action heads in numpy: ONE copy of each head's log-prob, entropy, KL and backward.

The same functions as :mod:`klppo.nn.distributions` (torch), on float32 arrays, for the numpy
update step (:mod:`klppo.rl.engine.numpy_stack`), its per-iteration KL and the rollout runner
(:mod:`klppo.nn.numpy.runner`). ``tests/nn/numpy/test_heads.py`` holds every quantity to the
torch head on random inputs.

* :class:`Categorical`: logits ``[n, k]``; ``log pi(a) = z_a - log sum_j e^{z_j}`` with
  ``z = logits - max``; entropy ``-sum_j p_j log p_j``; ``KL(old || new) = sum_j p_old_j
  (log p_old_j - log p_j)``.
* :class:`Gaussian`: mean ``[n, d]`` from the actor and a state-independent log-std ``[d]``
  (a view of the flat parameter buffer); ``log pi(a) = sum_i -z_i^2 / 2 - log sigma_i -
  log(2 pi) / 2`` with ``z = (a - mu) / sigma``; entropy ``sum_i log sigma_i + 1/2 + log(2 pi)/2``;
  ``KL(old || new) = 1/2 sum_i (r_i + (mu_old - mu)_i^2 / sigma_i^2 - 1 - log r_i)`` with
  ``r = sigma_old^2 / sigma^2``.

KLs are in nats per state. ``step`` returns ``(logp, entropy, kl, backward)`` where
``backward(g_logp, g_ent, g_kl) -> g_out`` maps per-sample gradients of the loss into the
gradient of the actor's output ``[n, k or d]`` (the Gaussian also writes d loss / d log-std).

Both heads also step the policies of several rows at once: the categorical head on samples
flattened to ``[A n, k]`` (every quantity is per sample), the Gaussian on ``[A, n, d]`` with
one log-std per row (``[A, 1, d]``, its gradient slot ``[A, 1, d]``). Per row the numbers are
those of the row alone (elementwise operations, and sums over the same axes in the same order).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from klppo.nn._rowops import row_cumsum, row_max, row_sum

__all__ = ["HALF_LOG_2PI", "Categorical", "Gaussian", "log_softmax", "NumpyHead"]

#: ``log(2 pi) / 2`` in float32, the Gaussian's normalising constant per dimension.
HALF_LOG_2PI = np.float32(0.5 * np.log(2 * np.pi))

Backward = Callable[[np.ndarray, np.ndarray | None, np.ndarray | None], np.ndarray]


def log_softmax(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log_softmax [n, k], e^z [n, k], sum_j e^z_j [n, 1])`` with ``z = logits - row max``."""
    z = logits - row_max(logits)
    ez = np.exp(z)
    s = row_sum(ez)
    return z - np.log(s), ez, s


class Categorical:
    """Softmax over logits ``[n, k]``; actions are int64 ``[n]``."""

    def __init__(self) -> None:
        self._rows: dict[int, np.ndarray] = {}

    def rows(self, n: int) -> np.ndarray:
        """``np.arange(n)``, kept between calls."""
        r = self._rows.get(n)
        if r is None:
            r = self._rows[n] = np.arange(n)
        return r

    @staticmethod
    def kl(logp_old_all: np.ndarray, logp_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(KL(old || new) [n], p_old [n, k])`` from both log-softmaxes ``[n, k]``."""
        p_old = np.exp(logp_old_all)
        return row_sum(p_old * (logp_old_all - logp_all))[:, 0], p_old

    def log_prob(self, out: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``log pi(actions) [n]`` at logits ``out``: the ``logp`` of :meth:`step`."""
        return log_softmax(out)[0][self.rows(out.shape[0]), actions]

    def step(self, out: np.ndarray, actions: np.ndarray, old_params: np.ndarray):
        """``(logp [n], entropy [n], KL(old || new) [n], backward)`` at logits ``out``."""
        logp_all, ez, s = log_softmax(out)
        p = ez / s
        rows = self.rows(out.shape[0])
        logp = logp_all[rows, actions]
        entropy = -row_sum(p * logp_all)[:, 0]
        kl, p_old = self.kl(log_softmax(old_params)[0], logp_all)

        def backward(g_logp, g_ent, g_kl):
            g_out = -g_logp[:, None] * p                   # d logp_a / d z = 1[a] - p
            g_out[rows, actions] += g_logp
            if g_ent is not None:                          # d H / d z = -p (log p + H)
                g_out -= g_ent[:, None] * p * (logp_all + entropy[:, None])
            if g_kl is not None:                           # d KL / d z = p - p_old
                g_out += g_kl[:, None] * (p - p_old)
            return g_out

        return logp, entropy, kl, backward

    def kl_mean(self, out: np.ndarray, old_params: np.ndarray) -> float:
        """Mean KL(old || new) over the rows, nats per state."""
        return float(self.kl(log_softmax(old_params)[0], log_softmax(out)[0])[0].mean())

    def act(self, out: np.ndarray, rng: np.random.Generator):
        """Sample by inverse CDF (one float32 uniform per row): ``(action, logp, params)``."""
        n, k = out.shape
        logp_all = log_softmax(out)[0]
        cdf = row_cumsum(np.exp(logp_all))
        u = rng.random((n,), dtype=np.float32)[:, None] * cdf[:, -1:]
        below = u >= cdf  # the action is the count of edges passed
        action = np.zeros(n, np.int64)
        for j in range(k - 1):  # the last edge can only add past k - 1 (cdf is monotone)
            action += below[:, j]
        return action, logp_all[np.arange(n), action], out


class Gaussian:
    """Diagonal Gaussian: mean ``[n, d]``, log-std ``[d]`` (a view of the weights), actions
    ``[n, d]``; params are ``[n, 2d]`` (mean then log-std). ``g_log_std`` (the log-std's slot in
    the flat gradient) is written by ``backward``; None for a head that only acts. Stepping
    ``A`` rows at once: mean, actions and params ``[A, n, ...]``, log-std and its slot
    ``[A, 1, d]``."""

    def __init__(self, log_std: np.ndarray, g_log_std: np.ndarray | None = None) -> None:
        self.log_std, self.g_log_std = log_std, g_log_std

    @staticmethod
    def logp(z: np.ndarray, log_std: np.ndarray) -> np.ndarray:
        """``log pi [n]`` from the standardised residual ``z = (a - mu) / sigma [n, d]``."""
        return (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)

    @staticmethod
    def kl(mean_old, log_std_old, mean, log_std, inv_var):
        """``(KL(old || new) [n], r = sigma_old^2 / sigma^2, mu_old - mu)``; ``inv_var`` is
        ``1 / sigma^2``, passed in because its two callers round it differently and each keeps
        its own trajectory bit for bit: the update step squares ``e^{-log sigma}``, which it has
        already; the per-iteration KL takes ``e^{-2 log sigma}`` as the torch head does."""
        var_ratio = np.exp(2 * (log_std_old - log_std))
        diff = mean_old - mean
        kl = 0.5 * (var_ratio + diff * diff * inv_var - 1 - 2 * (log_std_old - log_std)).sum(-1)
        return kl, var_ratio, diff

    def log_prob(self, out: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``log pi(actions) [n]`` at mean ``out``: the ``logp`` of :meth:`step`."""
        return self.logp((actions - out) * np.exp(-self.log_std), self.log_std)

    def step(self, out: np.ndarray, actions: np.ndarray, old_params: np.ndarray):
        """``(logp [n], entropy [n], KL(old || new) [n], backward)`` at mean ``out``
        (``[A, n]`` each for ``A`` rows)."""
        d = out.shape[-1]
        log_std = self.log_std
        inv_std = np.exp(-log_std)
        inv_var = inv_std**2
        zz = (actions - out) * inv_std
        logp = self.logp(zz, log_std)
        entropy = np.full(logp.shape, (log_std + 0.5 + HALF_LOG_2PI).sum(-1), np.float32)
        kl, var_ratio, diff = self.kl(old_params[..., :d], old_params[..., d:], out, log_std,
                                      inv_var)

        def backward(g_logp, g_ent, g_kl):
            g_out = g_logp[..., None] * zz * inv_std          # d logp / d mu = z / sigma
            g_ls = (g_logp[..., None] * (zz * zz - 1)).sum(-2)  # d logp / d log sigma = z^2 - 1
            if g_ent is not None:                             # d H / d log sigma = 1
                g_ls += g_ent.sum(-1)[..., None]
            if g_kl is not None:
                g_out -= g_kl[..., None] * diff * inv_var
                g_ls += (g_kl[..., None] * (1 - var_ratio - diff * diff * inv_var)).sum(-2)
            if self.g_log_std is None:
                raise RuntimeError("Gaussian.backward: this head only acts (no gradient slot)")
            self.g_log_std[...] = g_ls.reshape(self.g_log_std.shape)
            return g_out

        return logp, entropy, kl, backward

    def kl_mean(self, out: np.ndarray, old_params: np.ndarray) -> float:
        """Mean KL(old || new) over the rows, nats per state."""
        d, ls = out.shape[1], self.log_std
        return float(self.kl(old_params[:, :d], old_params[:, d:], out, ls,
                             np.exp(-2 * ls))[0].mean())

    def act(self, out: np.ndarray, rng: np.random.Generator):
        """Sample ``mu + sigma * noise`` (float32 normal noise): ``(action, logp, params)``."""
        n, d = out.shape
        log_std = self.log_std  # [d], broadcast over the rows: the same numbers per row
        noise = rng.standard_normal(out.shape, dtype=np.float32)
        action = out + np.exp(log_std) * noise
        params = np.empty((n, 2 * d), np.float32)
        params[:, :d] = out
        params[:, d:] = log_std
        return action, self.logp(noise, log_std), params


NumpyHead = Categorical | Gaussian
