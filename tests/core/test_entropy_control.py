"""The entropy controller: any KL rule, fed the entropy mirrored about the target."""

import pytest

from klppo.core.controllers import CONTROLLERS, make_controller
from klppo.core.entropy_control import EntropyControl, make_entropy_control

ENTROPIES = [0.69, 0.5, 0.2, 0.9, 1.4, 0.61, 0.0, 0.6]


@pytest.mark.parametrize("name", sorted(set(CONTROLLERS) - {"fixed"}))
def test_each_rule_sees_the_entropy_error_with_its_sign_flipped(name):
    ctrl = make_entropy_control(name, coef=0.01, target=0.6, coef_min=1e-5, coef_max=0.5)
    rule = make_controller(name, beta=0.01, target=0.6, beta_min=1e-5, beta_max=0.5)
    for h in ENTROPIES:
        assert ctrl.update(h, n_steps=512) == rule.update(2 * 0.6 - h, n_steps=512)
        assert rule.info is not None and ctrl.rule.info is not None
        if rule.info.relative_error is not None:  # d / target - 1 == 1 - H / target
            assert rule.info.relative_error == pytest.approx(1 - h / 0.6, abs=1e-12)


def test_the_coefficient_rises_below_the_target_and_falls_above_it():
    low = make_entropy_control("proportional", coef=0.01, target=0.6, horizon=1000)
    high = make_entropy_control("proportional", coef=0.01, target=0.6, horizon=1000)
    assert low.update(0.3, n_steps=100) > 0.01 > high.update(0.9, n_steps=100)
    capped = make_entropy_control("exponential", coef=0.01, target=0.6, coef_max=0.02,
                                  gain=100.0)
    assert capped.update(0.0) == 0.02  # bounded


def test_the_state_restores_the_coefficient_and_its_integrator():
    a = make_entropy_control("pid", coef=0.01, target=0.6, kp=0.1, ki=0.05)
    for h in ENTROPIES[:4]:
        a.update(h)
    b = make_entropy_control("pid", coef=0.01, target=0.6, kp=0.1, ki=0.05)
    b.load_state_dict(a.state_dict())
    assert b.value == a.value
    assert [b.update(h) for h in ENTROPIES[4:]] == [a.update(h) for h in ENTROPIES[4:]]
    with pytest.raises(ValueError, match="needs a target entropy"):
        EntropyControl(make_controller("fixed", beta=0.1))
