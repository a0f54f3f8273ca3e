"""Every token-level objective of the trust-region catalogue trains in the Gymnasium trainer
(on the numpy fast path, which serves them from their closed forms)."""

import dataclasses
import math

import pytest

from klppo import rl
from klppo.core.objectives import OBJECTIVES

CATALOGUE = [n for n, c in OBJECTIVES.items() if c.level == "token" and n not in
             ("clip", "per_sample_kl", "kl_penalty", "unclipped", "clip_kl")]


@pytest.mark.parametrize("objective", CATALOGUE)
def test_catalogue_objective_trains_on_the_fast_path(tmp_path, caplog, objective):
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), objective=objective, total_steps=1024,
                              tensorboard=False, out=str(tmp_path / "run"))
    res = rl.train(cfg)
    assert "numpy fast path off" not in caplog.text
    assert len(res.metrics) == 2
    assert all(math.isfinite(m["loss_objective"]) for m in res.metrics)


def test_a_catalogue_setting_changes_the_run(tmp_path):
    """ppo.tau_pos reaches SAPO's gate (a run with another temperature differs)."""
    base = dataclasses.replace(rl.preset("klip/cartpole"), objective="sapo", total_steps=1024,
                               tensorboard=False)
    a = rl.train(dataclasses.replace(base, out=str(tmp_path / "a")))
    b = rl.train(dataclasses.replace(base, out=str(tmp_path / "b"),
                                     ppo=dataclasses.replace(base.ppo, tau_pos=5.0)))
    assert a.metrics[-1]["loss_objective"] != b.metrics[-1]["loss_objective"]


def _r2vpo(tmp_path, **kl):
    base = dataclasses.replace(rl.preset("klip/cartpole"), objective="r2vpo", total_steps=2048,
                               tensorboard=False, out=str(tmp_path / "run"))
    opts = dict(controller="pid", beta=0.5, target=0.002, kp=0.0, ki=20.0, kd=0.0)
    return dataclasses.replace(base, kl=dataclasses.replace(base.kl, **{**opts, **kl}))


def test_r2vpo_dual_ascent_trains_on_the_ratio_variance(tmp_path):
    """R2VPO's multiplier is the PID controller's integral fed each minibatch's mean
    (w - 1)^2 (logged as kl_penalty); it moves, and stays >= 0."""
    res = rl.train(_r2vpo(tmp_path, cadence="minibatch", measure="last_minibatch"))
    betas = [m["beta"] for m in res.metrics]
    assert all(b >= 0 for b in betas) and betas[-1] != 0.5
    assert all(0 <= m["kl_penalty"] < 1 for m in res.metrics)


def test_r2vpo_refuses_to_drive_its_multiplier_with_the_rollout_kl(tmp_path):
    from klppo.runs.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^kl.measure='rollout': r2vpo"):
        rl.train(_r2vpo(tmp_path))
    assert not (tmp_path / "run").exists()


def test_kl_cadence_and_measure_values_are_checked(tmp_path):
    from klppo.runs.errors import ConfigError

    base = _r2vpo(tmp_path)
    for field, value in (("measure", "last"), ("cadence", "step")):
        bad = dataclasses.replace(base, kl=dataclasses.replace(base.kl, **{field: value}))
        with pytest.raises(ConfigError, match=rf"^kl.{field}='{value}': must be one of"):
            rl.train(bad)
    assert not (tmp_path / "run").exists()
