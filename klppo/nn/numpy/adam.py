"""Global-norm gradient clipping and Adam on a stack of flat parameter rows, in place: the one
numpy Adam (the engine's numpy stack, :mod:`klppo.rl.engine.numpy_stack`).

With ``g`` a row's flat gradient ``[P]``: ``g <- g * max_norm / (|g| + 1e-6)`` when that factor is
below 1 (torch's ``clip_grad_norm_``), then Adam (Kingma & Ba 2015) exactly as
``torch.optim.Adam`` computes it: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``. The state format
(``lr``, flat ``m`` and ``v``, step ``t``) is the torch stack's too
(:class:`klppo.rl.optim.TorchAdam`), so a checkpoint does not depend on the array library.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["NumpyAdam", "adam_update"]

B1, B2 = 0.9, 0.999


def _factors(lr: float, t: int, eps: float) -> tuple[np.float32, np.float32, np.float32]:
    """Step ``t``'s float32 factors: ``lr / (1 - b1^t)``, ``sqrt(1 - b2^t)`` and ``eps``."""
    return (np.float32(lr / (1 - B1**t)), np.float32(math.sqrt(1 - B2**t)), np.float32(eps))


def _factor_columns(lr: list[float], t: list[int], eps: list[float], rows: Any
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_factors` of each of ``rows`` as ``[A, 1]`` float32 columns: the same float64
    expressions, each rounded to float32 once (an array's cast rounds as ``np.float32`` does)."""
    def column(values: list[float]) -> np.ndarray:
        return np.array(values, np.float64).astype(np.float32)[:, None]

    return (column([lr[r] / (1 - B1**t[r]) for r in rows]),
            column([math.sqrt(1 - B2**t[r]) for r in rows]), column([eps[r] for r in rows]))


def adam_update(params, g, m, v, t, denom, step, bias2, eps) -> None:
    """One Adam step in place from the (clipped) gradient ``g``, with the textbook expressions;
    ``t`` and ``denom`` are work arrays of ``params``' shape. ``step``, ``bias2`` and ``eps``
    are :func:`_factors`: float32 scalars, or ``[R, 1]`` columns of them for a stack of ``R``
    parameter rows (each row then gets the scalar call's numbers bit for bit: every operation
    is elementwise)."""
    m *= B1
    np.multiply(g, 1 - B1, out=t)
    m += t                                   # m = b1 m + (1 - b1) g
    v *= B2
    np.multiply(g, 1 - B2, out=t)
    np.multiply(t, g, out=t)
    v += t                                   # v = b2 v + (1 - b2) g g
    np.sqrt(v, out=denom)
    np.divide(denom, bias2, out=denom)
    denom += eps
    np.multiply(m, step, out=t)
    np.divide(t, denom, out=t)
    params -= t                              # p -= lr_t m / (sqrt(v_hat) + eps)


class NumpyAdam:
    """Clip and Adam for ``R`` parameter rows at once (``params [R, P]``, one row per policy):
    each row has its own learning rate, epsilon, clip norm, step count and moments, and gets the
    numbers of a one-row stack of its own (the norm of each row by its own ``np.dot``, the clip
    factor 1 for a row under its limit, which changes no bit). ``row_state`` / ``load_row``
    read and write one row (``lr``, flat ``m`` and ``v``, step ``t``)."""

    def __init__(self, params: np.ndarray, lr: np.ndarray, eps: np.ndarray,
                 max_norm: np.ndarray) -> None:
        self.params = params
        R = params.shape[0]
        self.lr = np.asarray(lr, np.float64).reshape(R).copy()
        self.eps = np.asarray(eps, np.float64).reshape(R).copy()
        self.max_norm = np.asarray(max_norm, np.float64).reshape(R).copy()
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = np.zeros(R, np.int64)
        self._work: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def set_lr(self, r: int, lr: float) -> None:
        """Row ``r``'s learning rate."""
        self.lr[r] = float(lr)

    def _clip(self, grad: np.ndarray, idx: list[int]) -> list[float]:
        """Clip each row ``grad[a]`` (the gradient of row ``idx[a]``) in place by
        clip_grad_norm_'s rule; the pre-clip norms. Each row's squared norm is its own
        ``np.dot`` (``matmul`` of a row by a column calls the same BLAS dot), its square root a
        float32 one; a row under its limit is multiplied by 1, which changes no bit."""
        sq = np.matmul(grad[:, None, :], grad[:, :, None])[:, 0, 0]
        norms = np.sqrt(sq).astype(np.float64)
        coef = self.max_norm[idx] / (norms + 1e-6)
        # fmin: a NaN norm's row is left as it is (NaN < 1 is false in the rule)
        grad *= np.fmin(coef, 1.0).astype(np.float32)[:, None]
        return norms.tolist()

    def _clip_one(self, g: np.ndarray, r: int) -> float:
        """:meth:`_clip` of one row ``g`` (row ``r``'s gradient), without the stacked calls:
        the same dot, float32 square root and factor, applied only where it is below 1 (where
        :meth:`_clip` multiplies by 1, which changes no bit; a NaN norm's row as it is)."""
        norm = float(np.sqrt(np.dot(g, g)))
        coef = float(self.max_norm[r]) / (norm + 1e-6)
        if coef < 1.0:
            g *= np.float32(coef)
        return norm

    def step(self, grad: np.ndarray, rows: np.ndarray | None = None,
             params: np.ndarray | None = None) -> list[float]:
        """Clip each row of ``grad`` and apply Adam to ``params`` (default: every row of
        ``self.params``; with ``rows``, the gathered ``params[rows]`` copy, written back here);
        return each row's pre-clip norm."""
        whole = rows is None or len(rows) == len(self.t)
        idx = range(len(self.t)) if rows is None else [int(r) for r in rows]
        p = self.params if params is None else params
        m, v = (self.m, self.v) if whole else (self.m[idx], self.v[idx])
        factors: tuple[Any, ...]
        if len(idx) == 1:  # one row: its clip and float32 scalars (the stack's numbers, less
            r = idx[0]     # overhead)
            norms = [self._clip_one(grad[0], r)]
            self.t[r] += 1
            factors = _factors(float(self.lr[r]), int(self.t[r]), float(self.eps[r]))
        else:
            norms = self._clip(grad, list(idx))
            self.t[list(idx)] += 1
            factors = _factor_columns(self.lr.tolist(), self.t.tolist(), self.eps.tolist(), idx)
        work = self._work.get(p.shape)
        if work is None:
            work = self._work[p.shape] = (np.empty_like(p), np.empty_like(p))
        adam_update(p, grad, m, v, *work, *factors)
        if not whole:
            self.m[idx], self.v[idx] = m, v
            if params is not None:
                self.params[idx] = p
        return norms

    def row_state(self, r: int) -> dict[str, Any]:
        """Row ``r``'s Adam state."""
        return {"lr": float(self.lr[r]), "m": self.m[r].copy(), "v": self.v[r].copy(),
                "t": int(self.t[r])}

    def load_row(self, r: int, s: dict[str, Any]) -> None:
        """Set row ``r`` from a :meth:`row_state`."""
        self.lr[r], self.t[r] = float(s["lr"]), int(s["t"])
        self.m[r] = s["m"]
        self.v[r] = s["v"]
