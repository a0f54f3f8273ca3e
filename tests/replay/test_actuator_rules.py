"""The lr / clip actuators' step rules replay in the controller lab like beta controllers."""

import numpy as np

from klppo.core.actuators import RlGamesRule, RslRlRule
from klppo.replay.lab import open_loop
from tests.core.test_actuators import rl_games_lrs, rsl_rl_lrs


def test_rules_replay_in_the_controller_lab():
    """The lab's open loop takes an actuator rule as it takes a controller."""
    kls = list(np.random.default_rng(1).uniform(0, 0.04, 50))
    out = open_loop(kls, {"rsl_rl": RslRlRule(1e-3), "rl_games": RlGamesRule(1e-3)})
    assert out["rsl_rl"] == rsl_rl_lrs(kls, 1e-3)
    assert out["rl_games"] == rl_games_lrs(kls, 1e-3)


def test_bapo_replays_on_recorded_batches():
    """replay_bounds feeds a clip-bound controller (BAPO) batch after batch: the bounds equal
    Algorithm 1 transcribed from the paper; a bad batch is refused naming it."""
    import pytest

    from klppo.core.bound_controllers import BAPOController
    from klppo.replay.lab import replay_bounds
    from tests.core.test_bound_controllers import SETTINGS, batches, paper_bapo

    recorded = list(batches(5, 20, near=(0.4, 0.6, 1.2)))
    got = replay_bounds(recorded, BAPOController())
    assert got == [paper_bapo(w.tolist(), a.tolist(), *SETTINGS["paper"]) for w, a in recorded]
    with pytest.raises(ValueError, match=r"^batch 2: ratio holds a non-finite value"):
        replay_bounds([recorded[0], (np.array([np.nan]), np.array([1.0]))], BAPOController())
