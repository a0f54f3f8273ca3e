"""``klppo.train(env, **settings)``: SB3-shaped training from Python."""

import json

import gymnasium as gym
import numpy as np
import pytest

import klppo
from klppo.rl import quick
from klppo.rl.envs import EnvError, check_env
from klppo.runs.errors import ConfigError, InputError
from tests.rl import envs_for_tests as T

SMALL = {"total_steps": 256, "num_envs": 2, "num_steps": 64, "minibatch_size": 64,
         "update_epochs": 1}


def test_train_by_id_with_keywords_predicts_learns_on_and_saves(tmp_path):
    p = klppo.train("CartPole-v1", objective="per_sample_kl", lr=1e-3, target=0.02,
                    out=str(tmp_path / "r"), **SMALL)
    # each keyword landed in its section; the run is a normal run directory
    assert (p.config.objective, p.config.ppo.lr, p.config.kl.target) == ("per_sample_kl", 1e-3,
                                                                          0.02)
    assert p.run_dir == tmp_path / "r" and (p.run_dir / "checkpoint.pt").is_file()
    action, state = p.predict(np.zeros(4, np.float32), deterministic=True)
    assert state is None and int(action) in (0, 1)
    more = p.learn(128)
    assert more.config.total_steps == 384
    iters = [json.loads(x)["iteration"] for x in (p.run_dir / "metrics.jsonl").open()]
    assert iters == [1, 2, 3]  # 128 steps per iteration: trained on to the new total
    (p.run_dir / "policy.tmp").write_text("mine")  # a user's file: copied
    (p.run_dir / ".status.json.tmp999").write_text("{")  # a killed write's: left out
    copy = more.save(tmp_path / "copy")
    assert (copy / "policy.tmp").read_text() == "mine"
    assert not (copy / ".status.json.tmp999").exists() and not (copy / ".lock").exists()
    again = klppo.load(copy)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(again.act(obs), more.act(obs))
    with pytest.raises(InputError, match="already exists"):
        more.save(copy)


def test_a_class_or_a_factory_from_a_module_is_recorded_as_module_name(tmp_path):
    p = klppo.train(T.Counter, out=str(tmp_path / "cls"), **SMALL)
    assert p.config.env == "tests.rl.envs_for_tests:Counter"
    f = klppo.train(T.short_counter, out=str(tmp_path / "fn"), ppo={"update_epochs": 2},
                    **{k: v for k, v in SMALL.items() if k != "update_epochs"})
    assert f.config.env == "tests.rl.envs_for_tests:short_counter"
    assert f.config.ppo.update_epochs == 2


def test_module_name_resolves_a_class_or_factory_without_registration():
    # what a resume or klppo eval in another process does with the recorded id
    check_env("tests.rl.envs_for_tests:short_counter")
    assert gym.make("short_counter").unwrapped.limit == 5
    with pytest.raises(EnvError, match="COUNTER_INSTANCE is an environment instance"):
        check_env("tests.rl.envs_for_tests:COUNTER_INSTANCE")


def test_a_class_from_main_gets_a_process_local_id():
    class Local(T.Counter):
        pass

    first, second = quick.env_id(Local), quick.env_id(Local)
    assert first.startswith("klppo-local/Local.") and first != second
    assert isinstance(gym.make(first).unwrapped, Local)


@pytest.mark.parametrize("settings, message", [
    ({"eps": 3}, r"^ppo\.eps=3\.0: must be in \(0, 1\)"),
    ({"nope": 1}, r"^nope=1: not a setting of klppo train \(`klppo train --help` lists"),
    ({"lrr": 1e-3}, r"^lrr=0\.001: not a setting of klppo train \(did you mean lr\? "),
    ({"ppo": {"nope": 1}}, r"nope"),
])
def test_bad_settings_get_one_line_before_any_directory(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        klppo.train("CartPole-v1", out=str(tmp_path / "r"), **settings)
    assert not (tmp_path / "r").exists()


def test_an_env_instance_is_refused_saying_what_to_pass():
    with pytest.raises(ConfigError, match=r"an environment instance cannot be made again.*its "
                                          r"class, or a function that returns a new one"):
        klppo.train(gym.make("CartPole-v1"))


def test_a_name_in_several_sections_must_be_given_by_section(monkeypatch):
    monkeypatch.setattr(quick, "_sections", lambda: {"ppo": {"lr"}, "kl": {"lr"}})
    with pytest.raises(ConfigError, match=r"^lr=0\.1: in several sections \(kl\.lr, ppo\.lr\): "
                                          r"pass kl=\{'lr': \.\.\.\}"):
        quick.nested({"lr": 0.1})
