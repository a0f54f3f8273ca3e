"""The MLP forward/backward and Adam over a stack of networks give each network the numbers of its
own 2-D call, bit for bit (what the batched engine's per-run exactness rests on)."""

import numpy as np
import pytest
import torch

from klppo.nn._rowops import col_sum
from klppo.nn.numpy import mlp
from klppo.nn.numpy.adam import NumpyAdam

R = 5


def spans(sizes, at=7):
    """``[((w start, shape), (b start, shape)), ...]`` of an MLP laid out from offset ``at``
    (odd: as a row of the engine's stack, which starts anywhere), and the row length."""
    out = []
    for i, o in zip(sizes[:-1], sizes[1:]):
        out.append(((at, (o, i)), (at + o * i, (o,))))
        at += o * i + o
    return out, at


def views(buf, layout):
    """Stacked layers ``(W [R, out, in], b [R, out])`` of ``buf [R, P]``, or 2-D ones of a
    row ``buf [P]``."""
    def v(start, shape):
        n = int(np.prod(shape))
        return buf[..., start:start + n].reshape(*buf.shape[:-1], *shape)
    return [(v(*w), v(*b)) for w, b in layout]


@pytest.mark.parametrize("sizes,n", [((11, 64, 64, 3), 64), ((11, 64, 64, 1), 1),
                                     ((4, 64, 64, 2), 128), ((17, 32, 1), 3)])
def test_stacked_forward_and_backward_equal_each_networks_own(sizes, n):
    rng = np.random.default_rng(0)
    layout, P = spans(sizes)
    W = rng.standard_normal((R, P), dtype=np.float32) * np.float32(0.3)
    G = np.zeros_like(W)
    x = rng.standard_normal((R, n, sizes[0]), dtype=np.float32)
    g_out = rng.standard_normal((R, n, sizes[-1]), dtype=np.float32)
    acts = mlp.forward(views(W, layout), x, mlp.Workspace(), "a")
    mlp.backward(views(W, layout), views(G, layout), acts, g_out, mlp.Workspace())
    for r in range(R):
        w_r, g_r = W[r].copy(), np.zeros(P, np.float32)
        one = mlp.forward(views(w_r, layout), np.ascontiguousarray(x[r]), mlp.Workspace(), "a")
        for a_st, a_one in zip(acts, one):
            assert np.array_equal(a_st[r], a_one)
        mlp.backward(views(w_r, layout), views(g_r, layout), one,
                     np.ascontiguousarray(g_out[r]), mlp.Workspace())
        assert np.array_equal(G[r], g_r)
    assert np.count_nonzero(G[:, 7:]) == G[:, 7:].size  # every parameter got a gradient


def test_col_sum_of_a_stack_sums_each_in_numpys_order():
    rng = np.random.default_rng(1)
    for k in (1, 2, 3, 64):
        x = rng.standard_normal((R, 97, k), dtype=np.float32)
        out = np.empty((R, k + 3), np.float32)[:, :k]  # a strided out, as a row of a stack
        col_sum(x, out)
        for r in range(R):
            assert np.array_equal(out[r], np.ascontiguousarray(x[r]).sum(0))


def test_each_row_of_the_adam_stack_is_a_one_row_stack_of_its_own_with_clips_and_subsets():
    """A row's numbers do not depend on the rows beside it (nor on a subset stepping), and
    they are torch's clip_grad_norm_ + Adam (to float rounding)."""
    rng = np.random.default_rng(2)
    P = 1001
    W = rng.standard_normal((R, P), dtype=np.float32)
    lr, eps = np.array([3e-4, 1e-3, 1e-2, 3e-4, 5e-5]), np.array([1e-5, 1e-8, 1e-5, 1e-5, 1e-3])
    max_norm = np.array([0.5, 100.0, 0.5, 1e-3, 10.0])  # some rows clipped, some not
    stacked = NumpyAdam(W.copy(), lr, eps, max_norm)
    alone = [NumpyAdam(W[r:r + 1].copy(), lr[r:r + 1], eps[r:r + 1], max_norm[r:r + 1])
             for r in range(R)]
    params = [torch.nn.Parameter(torch.from_numpy(W[r].copy())) for r in range(R)]
    opts = [torch.optim.Adam([params[r]], lr=lr[r], eps=eps[r]) for r in range(R)]
    for step in range(6):
        g = rng.standard_normal((R, P), dtype=np.float32) * np.float32(step + 0.5)
        rows = np.arange(R) if step % 2 == 0 else np.array([0, 3, 4])  # an early-stopped pair
        if len(rows) == R:
            norms = stacked.step(g.copy())
        else:
            sub = stacked.params[rows]
            norms = stacked.step(g[rows].copy(), rows, sub)
        for a, r in enumerate(rows):
            assert alone[r].step(g[r:r + 1].copy()) == [norms[a]]
            params[r].grad = torch.from_numpy(g[r].copy())
            torch.nn.utils.clip_grad_norm_([params[r]], float(max_norm[r]))
            opts[r].step()
    for r in range(R):
        assert np.array_equal(stacked.params[r], alone[r].params[0])
        s, f = stacked.row_state(r), alone[r].row_state(0)
        assert s["t"] == f["t"] and s["lr"] == f["lr"]
        assert np.array_equal(s["m"], f["m"]) and np.array_equal(s["v"], f["v"])
        np.testing.assert_allclose(stacked.params[r], params[r].detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_adams_factor_columns_are_each_rows_own_factors_to_the_bit():
    """The stack's ``[A, 1]`` step factors equal the float32 scalars a row alone uses, over
    learning rates, step counts and epsilons of every size (a float64 array's cast rounds as
    ``np.float32`` of each number)."""
    from klppo.nn.numpy.adam import _factor_columns, _factors

    rng = np.random.default_rng(3)
    A = 2000
    lr = (10 ** rng.uniform(-9, 1, A)).tolist()
    t = np.exp(rng.uniform(0, 16, A)).astype(np.int64).clip(1).tolist()  # 1 .. 9e6 steps
    eps = (10 ** rng.uniform(-40, -1, A)).tolist()  # float32 subnormals and underflow too
    cols = _factor_columns(lr, t, eps, range(A))
    for r in range(A):
        for col, want in zip(cols, _factors(lr[r], t[r], eps[r])):
            assert col.dtype == np.float32 and col[r, 0].tobytes() == want.tobytes()


@pytest.mark.parametrize("P", [1, 7, 1001, 9155])
def test_the_stacks_clip_takes_each_rows_own_dot_for_its_norm(P):
    """The stack clips all rows in one call: each row's norm must still be its own
    ``np.sqrt(np.dot(g, g))`` (another summation order rounds otherwise) and its factor
    clip_grad_norm_'s, applied only where it is below 1; magnitudes from subnormal squares to
    an overflowing one, and a row holding a NaN (left as it is, as a row alone leaves it); a
    row alone (``_clip_one``) gets the same norm and row to the bit."""
    rng = np.random.default_rng(P)
    g = (rng.standard_normal((7, P)) * 10.0 ** rng.uniform(-20, 15, (7, 1))).astype(np.float32)
    g[6, 0] = np.nan
    max_norm = np.array([0.5, 1e30, 1e-3, 10.0, 0.5, 1.0, 0.5])
    adam = NumpyAdam(np.zeros((7, P), np.float32), np.full(7, 1e-3), np.full(7, 1e-5), max_norm)
    want = [float(np.sqrt(np.dot(row, row))) for row in g]
    clipped = g.copy()
    assert np.array_equal(adam._clip(clipped, list(range(7))), want, equal_nan=True)
    for r in range(7):
        coef = max_norm[r] / (want[r] + 1e-6)
        assert np.array_equal(clipped[r], g[r] * np.float32(coef) if coef < 1.0 else g[r],
                              equal_nan=True)
        one = g[r].copy()  # a row alone (a one-row stack's clip): the same norm and row
        norm = adam._clip_one(one, r)
        assert norm == want[r] or (np.isnan(norm) and np.isnan(want[r]))
        assert one.tobytes() == clipped[r].tobytes()
