import json
import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from klppo.core.controllers import CONTROLLERS, make_controller

TRACE = [0.05, 0.002, 0.0149, 0.016, 0.0, 0.03, 0.02, 0.1, 0.004, 0.00667]


def rllib_reference(trace, kl_coeff=0.2, kl_target=0.01):
    """RLlib PPO's update_kl, written as RLlib applies it."""
    out = []
    for sampled_kl in trace:
        if sampled_kl > 2.0 * kl_target:
            kl_coeff *= 1.5
        elif sampled_kl < 0.5 * kl_target:
            kl_coeff *= 0.5
        out.append(kl_coeff)
    return out


def torchrl_reference(trace, beta=1.0, dtarg=0.01, increment=2.0, decrement=0.5):
    """TorchRL KLPENPPOLoss's coefficient update, as applied at every loss call."""
    out = []
    for kl in trace:
        if kl > dtarg * 1.5:
            beta *= increment
        elif kl < dtarg / 1.5:
            beta *= decrement
        out.append(beta)
    return out


def trlx_reference(trace, n_steps, init=0.05, target=6.0, horizon=10000):
    """trlx AdaptiveKLController.update, as trlx applies it (numpy clip to +-0.2)."""
    value, out = init, []
    for current, n in zip(trace, n_steps):
        proportional_error = np.clip(current / target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n / horizon
        value *= mult
        out.append(value)
    return out


def test_step_ppo_paper_hand_trajectory():
    c = make_controller("step", preset="ppo_paper", target=0.01)
    # 0.05 > 0.015: x2 -> 2; 0.002 < 0.00667: /2 -> 1; 0.0149 inside -> 1; 0.016 > .015 -> 2
    # 0.0 -> 1; 0.03 -> 2; 0.02 -> 4; 0.1 -> 8; 0.004 -> 4; 0.00667 (>= 0.01/1.5) -> 4
    assert [c.update(d) for d in TRACE] == [2, 1, 1, 2, 1, 2, 4, 8, 4, 4]


def test_rllib_preset_matches_rllib_rule():
    rng = random.Random(0)
    trace = TRACE + [rng.uniform(0, 0.05) for _ in range(300)]
    c = make_controller("step", preset="rllib")
    assert c.value == 0.2 and c.target == 0.01
    assert [c.update(d) for d in trace] == rllib_reference(trace)


def test_torchrl_preset_matches_torchrl_rule():
    rng = random.Random(1)
    trace = TRACE + [rng.uniform(0, 0.03) for _ in range(300)]
    c = make_controller("step", preset="torchrl")
    assert [c.update(d) for d in trace] == torchrl_reference(trace)


def test_klip_preset_bounds_and_defaults():
    c = make_controller("step", preset="klip")
    assert (c.value, c.target, c.beta_min, c.beta_max) == (1.0, 0.02, 1e-4, 1e4)
    for _ in range(40):
        c.update(1.0)
    assert c.value == 1e4
    for _ in range(80):
        c.update(0.0)
    assert c.value == 1e-4


def test_proportional_matches_trlx_exactly_with_clip():
    rng = random.Random(2)
    trace = [rng.uniform(0, 15) for _ in range(500)]
    n_steps = [rng.randint(1, 512) for _ in range(500)]
    c = make_controller("proportional", beta=0.05, target=6, horizon=10000)
    got = [c.update(d, n) for d, n in zip(trace, n_steps)]
    assert got == trlx_reference(trace, n_steps)
    c2 = make_controller("proportional", beta=1.0, target=1.0, horizon=10)
    c2.update(5.0, n_steps=5)  # raw error 4, clipped to 0.2: beta *= 1 + 0.2 * 5 / 10
    assert c2.value == pytest.approx(1.1) and c2.info.error_clipped
    assert c2.info.relative_error == pytest.approx(4.0)
    c2.update(1.05)
    assert not c2.info.error_clipped


def test_exponential_hand_values_and_default_bounds():
    c = make_controller("exponential", beta=1.0, target=0.01, gain=10.0)
    assert c.update(0.11) == pytest.approx(math.e)
    assert c.update(-0.0 + 0.01) == pytest.approx(math.e)
    assert (c.beta_min, c.beta_max) == (1e-4, 10.0)
    for _ in range(10):
        c.update(1.0)
    assert c.value == 10.0


def test_pid_hand_values():
    c = make_controller("pid", beta=0.5, target=0.1, kp=2.0, ki=3.0, kd=4.0)
    # step 1: delta 0.1, I = 0.5 + 0.3 = 0.8, D = 0 (no history): beta = 0.2 + 0.8
    assert c.update(0.2) == pytest.approx(1.0)
    # step 2: delta 0.2, I = 0.8 + 0.6 = 1.4, D = 0.3 - 0.2 = 0.1: beta = 0.4 + 1.4 + 0.4
    assert c.update(0.3) == pytest.approx(2.2)
    # step 3: d = 0, delta -0.1, I = 1.4 - 0.3 = 1.1, D = max(0, -0.3) = 0: beta = -0.2 + 1.1
    assert c.update(0.0) == pytest.approx(0.9)
    c2 = make_controller("pid", beta=0.0, target=1.0, kp=1.0, ki=1.0)
    assert c2.update(0.0) == 0.0  # anti-windup: I clamps at 0 and beta at 0
    assert c2.integral == 0.0


def test_pid_ema_smoothing():
    c = make_controller("pid", beta=0.0, target=0.0 + 1.0, kp=1.0, ki=0.0, p_ema=0.5)
    c.update(3.0)  # first delta_s = 2
    assert c.update(1.0) == pytest.approx(1.0)  # delta_s = 0.5 * 2 + 0.5 * 0 = 1


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_state_dict_round_trip_continues_identically(name):
    rng = random.Random(3)
    trace = [rng.uniform(0, 0.05) for _ in range(40)]
    opts = {"target": 0.02}
    a = make_controller(name, **opts)
    for d in trace[:17]:
        a.update(d, n_steps=3)
    state = json.loads(json.dumps(a.state_dict()))  # survives a JSON checkpoint
    b = make_controller(name, **opts)
    b.load_state_dict(state)
    assert [a.update(d, 3) for d in trace[17:]] == [b.update(d, 3) for d in trace[17:]]
    assert a.state_dict() == b.state_dict()


@given(st.sampled_from(sorted(CONTROLLERS)),
       st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=50))
def test_bounds_always_hold(name, trace):
    c = make_controller(name, target=0.05, beta=0.5, beta_min=0.1, beta_max=2.0)
    for d in trace:
        assert 0.1 <= c.update(d) <= 2.0


def test_info_record():
    c = make_controller("step", preset="ppo_paper", target=0.01)
    c.update(0.02)
    i = c.info
    assert (i.target, i.observed, i.beta_before, i.beta_after) == (0.01, 0.02, 1.0, 2.0)
    assert i.relative_error == pytest.approx(1.0) and i.beta_change == 2.0
    assert set(i.as_dict()) >= {"target", "observed", "relative_error", "error_clipped",
                                "beta_before", "beta_after", "beta_change"}


@pytest.mark.parametrize(
    "name, opts, field",
    [
        ("step", {"target": 0.0}, "target"),
        ("proportional", {"target": -1.0}, "target"),
        ("proportional", {"horizon": 0}, "horizon"),
        ("step", {"increase": 0.9}, "increase"),
        ("step", {"decrease": 1.5}, "decrease"),
        ("fixed", {"beta_min": 2.0, "beta_max": 1.0}, "beta_min"),
        ("exponential", {"beta": -1.0}, "beta"),
        ("step", {"preset": "sb3"}, "preset"),
        ("pid", {"p_ema": 1.0}, "p_ema"),
        ("fixed", {"horizon": 3}, "horizon"),
    ],
)
def test_bad_options_name_the_field_and_value(name, opts, field):
    with pytest.raises(ValueError, match=field):
        make_controller(name, **opts)


def test_non_finite_kl_and_unknown_controller_raise():
    c = make_controller("fixed", beta=1.0)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="observed_kl"):
            c.update(bad)
    with pytest.raises(ValueError, match="controller must be one of"):
        make_controller("lagrange")


def test_proportional_without_target_is_fixed_like_trlx():
    """trlx: no target -> FixedKLController. klppo: make_controller says so through
    is_fixed_fallback (the callers log it) and still checks the proportional options."""
    from klppo.core.controllers import FixedKL, ProportionalKL, is_fixed_fallback

    for opts in ({"beta": 0.05}, {"beta": 0.05, "target": None, "horizon": 10_000}):
        c = make_controller("proportional", **opts)
        assert isinstance(c, FixedKL) and c.value == 0.05
        assert [c.update(d) for d in (0.1, 50.0, 0.0)] == [0.05] * 3
        assert is_fixed_fallback("proportional", opts)
    c = make_controller("proportional", beta=0.05, target=6.0)
    assert isinstance(c, ProportionalKL) and not is_fixed_fallback("proportional", {"target": 6})
    with pytest.raises(ValueError, match="horizon"):
        make_controller("proportional", horizon=0)


# ---------------------------------------------------------------- hold, bounds, run horizon
def test_hold_keeps_beta_until_the_kl_first_reaches_the_target_then_is_the_plain_rule():
    from klppo.core.controllers import ProportionalKL

    ramp = [0.0, 0.01, 0.03, 0.049]
    after = [0.08, 0.02, 0.05, 0.2, 0.01]
    held = ProportionalKL(beta=0.5, target=0.05, horizon=8, hold=True)
    for d in ramp:
        assert held.update(d, 8) == 0.5 and held.info.held
    plain = ProportionalKL(beta=0.5, target=0.05, horizon=8)
    for d in after:  # from the first reading at the target on, the same numbers as the rule
        assert held.update(d, 8) == plain.update(d, 8)
        assert not held.info.held
    # the state carries whether the target was reached
    again = ProportionalKL(beta=0.5, target=0.05, horizon=8, hold=True)
    again.load_state_dict(held.state_dict())
    assert again.reached and again.update(0.01, 8) == plain.update(0.01, 8)


@pytest.mark.parametrize("name", ["proportional", "exponential", "step", "pid"])
def test_a_hold_limit_releases_a_beta_the_kl_never_reaches_then_the_plain_rule(name):
    # beta strong enough to keep the KL at a quarter of its target: held for hold_limit updates,
    # from then on the rule's own numbers (the rule fed the same KLs from that point on)
    held = make_controller(name, beta=1.0, target=0.1, hold=True, hold_limit=3)
    for _ in range(3):
        assert held.update(0.025, 8) == 1.0 and held.info.held
    plain = make_controller(name, beta=1.0, target=0.1)
    released = [held.update(d, 8) for d in (0.025, 0.025, 0.05, 0.2)]
    assert released == [plain.update(d, 8) for d in (0.025, 0.025, 0.05, 0.2)]
    assert released[0] < 1.0 and not held.info.held
    again = make_controller(name, beta=1.0, target=0.1, hold=True, hold_limit=3)
    again.load_state_dict(held.state_dict())  # the update count carries the limit's progress
    assert again.update(0.025, 8) == plain.update(0.025, 8)


@pytest.mark.parametrize("limit, message", [
    (0, "hold_limit must be an integer >= 1"), (2.5, "hold_limit must be an integer"),
    (True, "hold_limit must be an integer")])
def test_a_hold_limit_is_a_positive_integer(limit, message):
    with pytest.raises(ValueError, match=message):
        make_controller("proportional", beta=1.0, target=0.1, hold=True, hold_limit=limit)


def test_a_hold_limit_without_hold_is_refused():
    with pytest.raises(ValueError, match="hold_limit=2 bounds a hold: set hold=True"):
        make_controller("proportional", beta=1.0, target=0.1, hold_limit=2)


def test_without_hold_the_ramp_lowers_beta():
    from klppo.core.controllers import ProportionalKL

    c = ProportionalKL(beta=0.5, target=0.05, horizon=8)
    c.update(0.0, 8)
    assert c.value == pytest.approx(0.5 * 0.8) and not c.info.held


@pytest.mark.parametrize("name, options", [
    ("proportional", {"horizon": 1.0}), ("exponential", {"gain": 100.0}), ("step", {}),
    ("pid", {"ki": 100.0})])
def test_a_rule_pressing_on_a_bound_says_which(name, options):
    c = make_controller(name, beta=1.0, target=0.05, beta_min=0.5, beta_max=2.0, **options)
    for _ in range(20):
        c.update(1.0)  # far above the target: beta rises to beta_max and stays
    assert c.value == 2.0 and c.info.at_bound == "beta_max"
    for _ in range(40):
        c.update(0.0)  # far below: down to beta_min
    assert c.value == 0.5 and c.info.at_bound == "beta_min"
    c.update(0.05)
    assert c.info.at_bound is None


def test_run_horizon_moves_beta_twentyfold_in_a_quarter_of_the_run():
    import math

    from klppo.core.controllers import ProportionalKL, run_horizon

    for updates, n in [(200, 8), (1000, 64), (64, 32)]:
        h = run_horizon(updates, n)
        c = ProportionalKL(beta=1.0, target=0.05, horizon=h, beta_max=1e9)
        for _ in range(updates // 4):
            c.update(1.0, n)  # the error clipped at +0.2 every update
        assert math.log(c.value) == pytest.approx(3.0, rel=1e-9)
    # short runs: at most 1.5x per update
    h = run_horizon(8, 16)
    c = ProportionalKL(beta=1.0, target=0.05, horizon=h)
    assert c.update(1.0, 16) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="updates and samples_per_update must be >= 1"):
        run_horizon(0, 8)


def test_relative_pid_gains_are_the_relative_ones_over_the_target():
    from klppo.core.controllers import relative_pid_gains

    assert relative_pid_gains(0.05) == {"kp": 1.0 / 0.05, "ki": 0.15 / 0.05, "kd": 0.0}
    assert relative_pid_gains(2.0, kp=0.5, ki=0.1, kd=1.0) == {"kp": 0.25, "ki": 0.05,
                                                               "kd": 0.5}
    # an error of 100% of the target moves beta by kp_rel at once, its integral by ki_rel
    pid = make_controller("pid", beta=0.0, target=0.05, **relative_pid_gains(0.05))
    assert pid.update(0.1) == pytest.approx(1.0 + 0.15)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="target"):
            relative_pid_gains(bad)
