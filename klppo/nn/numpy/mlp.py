"""ONE numpy forward and backward of a tanh MLP ``Linear (Tanh Linear)*``.

A layer is ``(W [out, in], b [out])``, views of the flat weights
(:meth:`klppo.nn.numpy.weights.FlatWeights.mlp`). Forward: ``h_0 = x``,
``h_{k+1} = tanh(h_k W_k^T + b_k)`` except the last layer, which stays linear. Backward, from
``g = d loss / d h_L [n, out]``: ``dW_k = g^T h_k``, ``db_k = sum_rows g``, and
``g <- (g W_k) * (1 - h_k^2)`` below a tanh layer.

Both also take a stack of networks of one shape (the engine's numpy stack,
:mod:`klppo.rl.engine.numpy_stack`):
``W [R, out, in]``, ``b [R, out]``, ``x [R, n, in]``. numpy's stacked ``matmul`` makes one BLAS
call per network with the 2-D call's arguments, and every other operation is elementwise or sums
in the 2-D order, so network r of the stack gets the 2-D result bit for bit
(``tests/nn/numpy/test_stacked.py``).
"""

from __future__ import annotations

import numpy as np

from klppo.nn._rowops import col_sum

__all__ = ["Workspace", "forward", "backward"]

Layer = tuple[np.ndarray, np.ndarray]


class Workspace:
    """Reusable float32 work arrays by key: temporaries of minibatch size would otherwise cost
    an allocation (and page faults) each, several times the arithmetic at 2048 samples.
    Backward temporaries are shared by both networks (a smaller working set in cache)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, np.ndarray] = {}

    def get(self, key: tuple, shape: tuple[int, ...]) -> np.ndarray:
        k = (key, shape)
        b = self._bufs.get(k)
        if b is None:
            b = self._bufs[k] = np.empty(shape, np.float32)
        return b


def forward(layers: list[Layer], x: np.ndarray, ws: Workspace | None = None,
            tag: str = "") -> list[np.ndarray]:
    """Activations ``[x, h_1, ..., h_L]`` (``h_L [n, out]`` is the output). With a workspace
    the activations live in its buffers (keyed by ``tag``) and are overwritten by the next call
    with the same tag: copy what must outlive it. A stack of one network is computed as the
    network alone (the same BLAS call, without the stacked loop's overhead)."""
    if x.ndim == 3 and x.shape[0] == 1:
        return [a[None] for a in forward(_first(layers), x[0], ws, tag)]
    acts, last = [x], len(layers) - 1
    for k, (w, b) in enumerate(layers):
        if ws is None:
            out = np.matmul(x, _t(w))
        else:
            out = np.matmul(x, _t(w), out=ws.get((tag, "a", k), x.shape[:-1] + w.shape[-2:-1]))
        np.add(out, b if b.ndim == 1 else b[..., None, :], out=out)
        if k < last:
            np.tanh(out, out=out)
        acts.append(out)
        x = out
    return acts


_OUTER = {2: "i,j->ij", 3: "ri,rj->rij"}


def _first(layers: list[Layer]) -> list[Layer]:
    """The first network of stacked layers."""
    return [(w[0], b[0]) for w, b in layers]


def _t(a: np.ndarray) -> np.ndarray:
    """The transpose of a matrix, or of each matrix of a stack (a view)."""
    return a.T if a.ndim == 2 else a.swapaxes(-1, -2)  # the method: no dispatch overhead


def backward(layers: list[Layer], grads: list[Layer], acts: list[np.ndarray], g: np.ndarray,
             ws: Workspace) -> None:
    """Write d loss / d (W_k, b_k) into ``grads`` (views of the flat gradient), from
    ``g = d loss / d output [n, out]`` and the forward's ``acts`` (a stack of one as the
    network alone, as :func:`forward`)."""
    if g.ndim == 3 and g.shape[0] == 1:
        backward(_first(layers), _first(grads), [a[0] for a in acts], g[0], ws)
        return
    for k in range(len(layers) - 1, -1, -1):
        w = layers[k][0]
        gw, gb = grads[k]
        np.matmul(_t(g), acts[k], out=gw)
        # numpy's row-after-row order, not ones @ g (faster still): the summation order
        # changes the rounding and with it whole trajectories; the learning numbers were
        # measured with this one
        col_sum(g, gb)
        if k:
            gn = ws.get(("g", k % 2), g.shape[:-1] + w.shape[-1:])  # k % 2: never the input g
            if w.shape[-2] == 1:  # one output: an outer product (one rounding, as in
                np.einsum(_OUTER[g.ndim], g[..., 0], w[..., 0, :], out=gn)  # BLAS), 4x faster
            else:
                np.matmul(g, w, out=gn)
            tmp = ws.get(("t",), gn.shape)
            np.multiply(acts[k], acts[k], out=tmp)
            np.subtract(1.0, tmp, out=tmp)
            np.multiply(gn, tmp, out=gn)
            g = gn
