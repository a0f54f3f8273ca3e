"""proportional_zeroing_steps: the samples per update from which one ProportionalKL update below
target takes beta to 0, tied to the rule itself (configs refuse settings beyond it)."""

import pytest

from klppo.core.controllers import ProportionalKL, proportional_zeroing_steps


def test_the_rule_defaults_and_explicit_settings():
    assert proportional_zeroing_steps() == 10000 / 0.2
    assert proportional_zeroing_steps(100.0) == 100 / 0.2
    assert proportional_zeroing_steps(100.0, 0.5) == 200.0


@pytest.mark.parametrize("horizon, clip", [(100.0, 0.2), (7.0, 0.5), (10000.0, 0.2)])
def test_at_the_count_one_update_zeroes_beta_and_below_it_does_not(horizon, clip):
    n = proportional_zeroing_steps(horizon, clip)
    for steps, zeroed in ((n, True), (0.99 * n, False)):
        ctrl = ProportionalKL(beta=1.0, target=6.0, horizon=horizon, clip=clip)
        ctrl.update(0.0, n_steps=steps)  # far below target: the error clips at -clip
        assert (ctrl.value <= 0.0) == zeroed, (steps, ctrl.value)
