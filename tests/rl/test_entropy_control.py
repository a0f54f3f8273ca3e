"""ppo.ent_target: the entropy coefficient driven by a klppo rule in the trainer, in both
numpy and torch paths; refused settings; the logged values are the rule replayed."""

import dataclasses

import pytest

from klppo import rl
from klppo.core.entropy_control import make_entropy_control
from klppo.runs.errors import ConfigError


def _config(tmp_path, fast_path=True, **ppo):
    cfg = rl.preset("klip/cartpole")
    cfg = dataclasses.replace(cfg, total_steps=4 * cfg.batch_size, tensorboard=False,
                              out=str(tmp_path / "run"), fast_path=fast_path)
    cfg.ppo = dataclasses.replace(cfg.ppo, **ppo)
    return rl.validate(cfg)


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_coefficient_is_the_rule_replayed_on_the_logged_entropies(tmp_path, fast_path):
    cfg = _config(tmp_path, fast_path, ent_coef=0.01, ent_target=0.66,
                  ent_controller="proportional")
    res = rl.train(cfg)
    replay = make_entropy_control("proportional", 0.01, 0.66, 1e-5, 0.1)
    for m in res.metrics:
        assert m["ent_coef"] == replay.value
        # the loss used it: the entropy term is -ent_coef times the minibatches' entropy
        assert m["loss_entropy"] == pytest.approx(-m["ent_coef"] * m["entropy"], rel=1e-4)
        replay.update(m["entropy"], n_steps=cfg.batch_size)
        assert m["ent_coef_next"] == replay.value
    assert len({m["ent_coef"] for m in res.metrics}) == 4  # it moved every update


def test_entropy_settings_without_a_target_or_out_of_bounds_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"ppo.ent_controller='pid': only ppo.ent_target"):
        _config(tmp_path, ent_controller="pid")
    with pytest.raises(ConfigError, match=r"ppo.ent_coef=0.0: must start in"):
        _config(tmp_path, ent_target=0.5)
    with pytest.raises(ConfigError, match=r"ppo.ent_coef_max=1e-06: must be > ppo.ent_coef_min"):
        _config(tmp_path, ent_target=0.5, ent_coef=1e-5, ent_coef_max=1e-6)
    with pytest.raises(ConfigError, match=r"ppo.ent_target=inf"):
        _config(tmp_path, ent_target=float("inf"), ent_coef=0.01)
