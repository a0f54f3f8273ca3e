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
