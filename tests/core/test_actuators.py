"""The KL step rules that drive the learning rate or the clip radius (klppo.core.actuators),
against rsl_rl's and rl_games' rules written out here as those libraries apply them."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from klppo.core.actuators import (
    CLIP_BOUNDS,
    RlGamesRule,
    RslRlRule,
    make_actuator_rule,
)


def rsl_rl_lrs(kls, lr, desired_kl=0.01, lo=1e-5, hi=1e-2):
    """rsl_rl/algorithms/ppo.py, ``PPO.update`` with ``schedule="adaptive"``, transcribed (its
    constants 1e-5 and 1e-2 are ``lo`` and ``hi``)."""
    out = []
    for kl_mean in kls:
        if kl_mean > desired_kl * 2.0:
            lr = max(lo, lr / 1.5)
        elif kl_mean < desired_kl / 2.0 and kl_mean > 0.0:
            lr = min(hi, lr * 1.5)
        out.append(lr)
    return out


def rl_games_lrs(kls, lr, kl_threshold=0.008, min_lr=1e-6, max_lr=1e-2):
    """rl_games/common/schedulers.py, ``AdaptiveScheduler.update``, transcribed."""
    out = []
    for kl_dist in kls:
        current_lr = lr
        if kl_dist > (2.0 * kl_threshold):
            lr = max(current_lr / 1.5, min_lr)
        if kl_dist < (0.5 * kl_threshold):
            lr = min(current_lr * 1.5, max_lr)
        out.append(lr)
    return out


def run(rule, kls):
    return [rule.update(d) for d in kls]


def test_hand_computed_steps():
    r = RslRlRule(1e-3)
    assert (r.target, r.lower, r.upper, r.timing) == (0.01, 1e-5, 1e-2, "before_step")
    assert r.update(0.03) == 1e-3 / 1.5          # above 2 x target: down
    assert r.update(0.01) == 1e-3 / 1.5          # inside the band: unchanged
    assert r.update(0.004) == 1e-3 / 1.5 * 1.5   # below target / 2: up
    assert r.update(0.0) == 1e-3 / 1.5 * 1.5     # rsl_rl's guard: a KL of 0 changes nothing
    assert r.info.value_before == r.info.value_after and r.info.observed == 0.0
    g = RlGamesRule(1e-3)
    assert (g.target, g.lower, g.upper, g.timing) == (0.008, 1e-6, 1e-2, "after_step")
    assert g.update(0.0) == 1e-3 * 1.5           # rl_games has no guard at 0
    assert g.update(0.017) == 1e-3 * 1.5 / 1.5
    assert g.num_updates == 2


def test_bounds_hold_and_are_reached():
    r = RslRlRule(1e-3)
    assert run(r, [1.0] * 40)[-1] == 1e-5
    assert run(r, [1e-4] * 40)[-1] == 1e-2
    eps = make_actuator_rule("rl_games", "clip", 0.2)
    assert (eps.lower, eps.upper) == CLIP_BOUNDS
    assert run(eps, [1.0] * 40)[-1] == CLIP_BOUNDS[0]


@given(st.lists(st.floats(-1e-3, 0.1, allow_nan=False), max_size=200),
       st.floats(1e-5, 1e-2))
def test_rsl_rl_rule_equals_transcription(kls, lr):
    assert run(RslRlRule(lr), kls) == rsl_rl_lrs(kls, lr)


@given(st.lists(st.floats(-1e-3, 0.1, allow_nan=False), max_size=200),
       st.floats(1e-6, 1e-2))
def test_rl_games_rule_equals_transcription(kls, lr):
    assert run(RlGamesRule(lr), kls) == rl_games_lrs(kls, lr)


def test_edges_of_the_band_exactly():
    """KLs at and next to the thresholds: the strict comparisons of both libraries."""
    t = 0.01
    edges = [t * 2.0, np.nextafter(t * 2.0, 1), np.nextafter(t * 2.0, 0), t / 2.0,
             np.nextafter(t / 2.0, 0), np.nextafter(t / 2.0, 1), 0.0, 5e-324, -1e-9]
    kls = [float(x) for x in edges] * 3
    assert run(RslRlRule(1e-3, target=t), kls) == rsl_rl_lrs(kls, 1e-3, desired_kl=t)
    assert run(RlGamesRule(1e-3, target=t), kls) == rl_games_lrs(kls, 1e-3, kl_threshold=t)


def test_state_dict_resumes_identically():
    kls = list(np.random.default_rng(0).uniform(0, 0.05, 60))
    full = RslRlRule(3e-4)
    expect = run(full, kls)
    first = RslRlRule(3e-4)
    run(first, kls[:25])
    again = RslRlRule(3e-4)  # a fresh rule from the config, as a resumed run builds it
    again.load_state_dict(first.state_dict())
    assert again.value == first.value != 3e-4
    assert expect[:25] + run(again, kls[25:]) == expect
    assert again.num_updates == 60
    with pytest.raises(ValueError, match="state_dict is for actuator rule 'rsl_rl'"):
        RlGamesRule(3e-4).load_state_dict(first.state_dict())


@pytest.mark.parametrize("kwargs, match", [
    (dict(value=0.05), "value must lie in"),
    (dict(value=1e-3, lower=1e-2, upper=1e-3), "lower must be < upper"),
    (dict(value=1e-3, target=0.0), "target must be finite and > 0"),
    (dict(value=1e-3, target=math.nan), "target must be finite"),
    (dict(value=1e-3, factor=1.0), "factor must be > 1"),
    (dict(value=1e-3, band=0.5), "band must be > 1"),
    (dict(value=-1.0), "value must be finite and > 0"),
])
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RslRlRule(**kwargs)


def test_bad_kl_and_names():
    with pytest.raises(ValueError, match="observed_kl must be finite"):
        RslRlRule(1e-3).update(math.inf)
    with pytest.raises(ValueError, match="rule must be one of"):
        make_actuator_rule("sb3", "lr", 1e-3)
    with pytest.raises(ValueError, match="knob must be lr or clip"):
        make_actuator_rule("rsl_rl", "beta", 1e-3)
