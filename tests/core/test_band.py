"""The one kill-set definition (klppo.core.band) on torch and numpy, and its users."""

import numpy as np
import torch

from klppo.core.band import DEFAULT_EPS, kill_mask, kill_sides
from klppo.core.objective_base import Band, _clip_beta_np
from klppo.core.surrogates import partition, per_sample_beta, phi_penalty


def _inputs(n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.exp(0.4 * torch.randn(n, generator=g))
    a = torch.randn(n, generator=g)
    a[::7] = 0.0
    return w, a


def test_kill_mask_is_the_same_on_torch_and_numpy():
    w, a = _inputs()
    for lo, hi in ((0.2, 0.2), (0.1, 0.28)):
        t = kill_mask(w, a, lo, hi).numpy()
        n = kill_mask(w.numpy(), a.numpy(), lo, hi)
        np.testing.assert_array_equal(t, n)
        up, down = kill_sides(w, a, lo, hi)
        assert not bool((up & down).any()) and 0 < int(t.sum()) < len(t)


def test_every_user_reads_the_one_kill_set():
    w, a = _inputs(seed=1)
    kill = kill_mask(w, a, DEFAULT_EPS, DEFAULT_EPS)
    assert torch.equal(partition(w, a)[2], kill)
    assert torch.equal(phi_penalty(w, a) != 0, kill & (w * a != 0))
    assert torch.equal(per_sample_beta(w, a) != 0, kill)
    beta_np = _clip_beta_np(w.numpy(), a.numpy(), (w * a).numpy(), Band())
    np.testing.assert_array_equal(beta_np, per_sample_beta(w, a).numpy())
