"""Every preset of SPEC section 5 builds its environment and runs one iteration, when the
extra it needs (box2d, mujoco) is installed; otherwise the error names the pip command."""

import dataclasses
import importlib.util
import math
import sys

import pytest

import klppo.rl as rl
from klppo.rl.envs import EnvError
from klppo.rl.presets import PRESETS

EXTRA = {"klip/lunarlander": "Box2D"} | {
    k: "mpe2" if k.startswith("marl/") else "mujoco" for k in PRESETS
    if k not in ("klip/cartpole", "klip/lunarlander")}
EXTRA_NAME = {"Box2D": "box2d", "mujoco": "mujoco", "mpe2": "marl"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_runs_one_iteration(tmp_path, name):
    c = rl.preset(name)
    one = c.rollout.num_envs * c.rollout.num_steps
    c = dataclasses.replace(c, out=str(tmp_path / "run"), total_steps=one, tensorboard=False,
                            ppo=dataclasses.replace(c.ppo, update_epochs=1))
    module = EXTRA.get(name)
    if module and importlib.util.find_spec(module) is None:
        extra = EXTRA_NAME[module]
        with pytest.raises(EnvError, match=rf"pip install -c constraints.txt -e '\.\[{extra}\]'"):
            rl.train(c)
        return
    res = rl.train(c)
    (m,) = res.metrics
    assert m["global_step"] == one
    prefixes = [f"{p}/" for p in res.policies] or [""]  # a multi-agent run: every policy
    assert all(math.isfinite(m[p + k]) for p in prefixes
               for k in ("kl_rollout", "loss", "value_loss", "entropy"))
    assert res.status == "finished"


@pytest.mark.parametrize("env_id, extra, modules", [
    ("LunarLander-v3", "box2d",
     ["Box2D", "gymnasium.envs.box2d", "gymnasium.envs.box2d.lunar_lander"]),
    ("Hopper-v5", "mujoco",
     ["mujoco", "gymnasium.envs.mujoco", "gymnasium.envs.mujoco.hopper_v5"]),
])
def test_a_missing_extra_names_the_pip_command(tmp_path, monkeypatch, capsys, env_id, extra,
                                               modules):
    """Whether or not the extra is installed here, hide it and check the CLI's message."""
    from klppo.cli import main

    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)  # import -> ImportError
    assert main(["train", "--env", env_id, "--out", str(tmp_path / "run")]) == 2
    assert f"pip install -c constraints.txt -e '.[{extra}]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # raised before the run directory is made
