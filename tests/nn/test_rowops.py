import numpy as np
import pytest

from klppo.nn._rowops import MAX_COLUMNS, col_sum, row_cumsum, row_max, row_sum


@pytest.mark.parametrize("k", range(1, MAX_COLUMNS + 3))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_reductions_equal_numpy_bit_for_bit(k, dtype):
    rng = np.random.default_rng(k)
    # wide dynamic range so that any other summation order rounds differently somewhere
    x = (rng.standard_normal((20000, k)) * 10.0 ** rng.uniform(-6, 6, (20000, k))).astype(dtype)
    x[::97, 0] = np.nan  # NaN propagates like numpy's
    for fast, ref in ((row_max, x.max(1, keepdims=True)), (row_sum, x.sum(1, keepdims=True)),
                      (row_cumsum, np.cumsum(x, 1))):
        got = fast(x)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)


def test_a_different_order_would_be_caught():
    """The data above separates summation orders: right-to-left differs from numpy."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((20000, 4)) * 10.0 ** rng.uniform(-6, 6, (20000, 4))).astype(
        np.float32)
    rtl = x[:, 3] + x[:, 2] + x[:, 1] + x[:, 0]
    assert not np.array_equal(rtl, x.sum(1))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 8, 9, 16, 17, 63, 64, 65, 128, 256])
@pytest.mark.parametrize("n", [1, 64, 2048, 4096])
def test_column_sum_equals_numpy_bit_for_bit(k, n):
    rng = np.random.default_rng(k * n)
    x = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-4, 4, (n, k))).astype(np.float32)
    out = np.empty(k, np.float32)
    assert col_sum(x, out) is out
    np.testing.assert_array_equal(out, np.sum(x, axis=0))
    xf = np.asfortranarray(x)  # numpy sums this layout pairwise: the fallback keeps that
    np.testing.assert_array_equal(col_sum(xf, out), np.sum(xf, axis=0))


def test_column_sum_order_matters_on_this_data():
    """Pairwise (torch's order) and sequential sums differ here, so the test above can fail."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4096, 64)) * 10.0 ** rng.uniform(-4, 4, (4096, 64))).astype(
        np.float32)
    assert not np.array_equal(np.sum(x, axis=0), np.ascontiguousarray(x.T).sum(1))
