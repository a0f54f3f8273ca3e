"""The Python API refuses bad input as the CLI does (issue #32): ``klppo.load``, ``predict``,
``act`` and ``export`` raise klppo's error type with one sentence naming the argument and the
value; a tampered ``spaces.json`` is named (with the checkpoint, where the two disagree); a
checkpoint whose contents do not fit the run is refused when it is loaded, not iterations
later; each size a file or a flag gives is bounded before anything is allocated."""

import dataclasses
import json
import threading

import numpy as np
import pytest

import klppo
from klppo import rl
from klppo.runs import checkpoint as ckpt
from klppo.runs.errors import CheckpointError, InputError, ResumeError, UserInputError


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), total_steps=1024, tensorboard=False,
                              out=str(out), checkpoint_every=1)
    return rl.train(cfg).run_dir


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), env="Pendulum-v1", total_steps=1024,
                              tensorboard=False, out=str(out))
    cfg.rollout = dataclasses.replace(cfg.rollout, norm_obs=True)
    return rl.train(rl.validate(cfg)).run_dir


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and isinstance(e.value, UserInputError)
    return text


def test_a_loaded_policy_has_its_spaces(cartpole, pendulum):
    p, q = klppo.load(cartpole), klppo.load(pendulum)
    assert p.observation_space.shape == (4,) and p.action_space.n == 2
    assert q.observation_space.shape == (3,) and q.action_space.shape == (1,)


@pytest.mark.parametrize("obs, shape", [(np.ones(7), [7]), (np.ones(8), [8]),
                                        (np.ones((2, 5)), [2, 5]), (np.ones((0, 4)), [0, 4]),
                                        (np.ones((2, 2, 2)), [2, 2, 2])])
def test_predict_refuses_observations_of_another_shape(cartpole, obs, shape):
    """One observation [4] or a batch [B, 4]: 8 values are not two observations, 7 are not
    one (numpy's reshape error, or a silent second action, before)."""
    p = klppo.load(cartpole)
    with pytest.raises(InputError) as e:
        p.predict(obs)
    assert one_line(e) == (f"observation: has shape {shape}; the policy takes one observation "
                           f"[4] or a batch [B, 4]")


def test_predict_and_act_take_what_they_should(cartpole):
    p = klppo.load(cartpole)
    a, state = p.predict(np.ones(4), deterministic=True)
    assert np.ndim(a) == 0 and state is None
    assert p.predict(np.ones((3, 4)))[0].shape == (3,)
    assert p.act(np.ones((2, 4))).shape == (2,)
    with pytest.raises(InputError) as e:  # act takes batches only
        p.act(np.ones(4))
    assert "obs: has shape [4]; the policy takes a batch [B, 4]" in one_line(e)
    with pytest.raises(InputError) as e:
        p.predict("four numbers")
    assert one_line(e).startswith("observation: cannot be read as numbers")


def test_export_refuses_a_path_it_cannot_write(cartpole, tmp_path):
    p = klppo.load(cartpole)
    with pytest.raises(InputError) as e:
        p.export(tmp_path / "nodir" / "sub" / "p.pt2")
    assert "its directory" in one_line(e) and "does not exist" in str(e.value)
    with pytest.raises(InputError) as e:
        p.export(tmp_path)
    assert "a directory; give the file to write" in one_line(e)
    assert not (tmp_path / "nodir").exists()


def _tampered(run, edit, tmp_path):
    """A copy of ``run`` whose spaces.json ``edit`` changed."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    data = json.loads((copy / "spaces.json").read_text())
    edit(data)
    (copy / "spaces.json").write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["observation"].__setitem__("low", [5.0, 0, 0, 0]),
     "a lower bound exceeds its upper bound"),
    (lambda d: d["observation"].__setitem__("high", ["nan", 1, 1, 1]), "a bound is NaN"),
    (lambda d: d["observation"].update(shape=[5], low=[0] * 5, high=[1] * 5),
     "the observation space has 5 values but the checkpoint's network takes 4"),
    (lambda d: d["action"].__setitem__("n", 3),
     "the action space has 3 actions but the checkpoint's network scores 2"),
    (lambda d: d["action"].__setitem__("start", 1), "klppo trains actions 0 .. n - 1"),
    (lambda d: d["observation"].__setitem__("shape", [10**9]),
     "holds 1,000,000,000 values; klppo's networks take 1 to 1,000,000"),
    (lambda d: d.pop("action"), "(action): not a Box or Discrete space"),
], ids=["low-above-high", "nan-bound", "other-obs-size", "other-action-count",
        "discrete-start", "huge-shape", "no-action"])
def test_a_tampered_spaces_json_is_named(cartpole, tmp_path, edit, words):
    copy = _tampered(cartpole, edit, tmp_path)
    with pytest.raises(CheckpointError) as e:
        klppo.load(copy)
    assert "spaces.json" in one_line(e) and words in str(e.value)
    if "network takes" in words or "network scores" in words:  # only the env could tell
        # which of the two files is wrong: both are named
        assert "checkpoint.pt and " in str(e.value) and "env CartPole-v1" in str(e.value)
    else:  # spaces.json alone is wrong
        assert "checkpoint.pt" not in str(e.value).split(":")[0]


def _resume_forged(run, edit, tmp_path):
    """Resume a copy of ``run`` whose checkpoint ``edit`` changed; the refusal, and the
    copy's checkpoint untouched."""
    import shutil

    copy = tmp_path / "forged"
    shutil.copytree(run, copy)
    state = ckpt.load_checkpoint(copy)
    edit(state)
    ckpt.save_checkpoint(copy, state)
    before = (copy / "checkpoint.pt").read_bytes()
    with pytest.raises(ResumeError) as e:
        rl.resume(copy)
    assert (copy / "checkpoint.pt").read_bytes() == before
    return one_line(e)


@pytest.mark.parametrize("edit, words", [
    (lambda s: s["collector"].__setitem__("next_obs", np.zeros((4, 5), np.float32)),
     "collector.next_obs has shape [4, 5], the run's envs give [4, 4]"),
    (lambda s: s["collector"].__setitem__("ep_length", np.array([1, 2, -3, 4])),
     "collector.ep_return / ep_length"),
    (lambda s: s["optimizer"].__setitem__("t", -7), "optimizer.t=-7: must be a step count"),
    (lambda s: s["optimizer"].__setitem__("lr", -1.0), "optimizer.lr=-1.0"),
    (lambda s: s["optimizer"].__setitem__("v", -np.ones_like(s["optimizer"]["v"])),
     "optimizer.v: holds non-finite or (second moment) negative values"),
    (lambda s: s["optimizer"].__setitem__("m", np.zeros(3, np.float32)),
     "optimizer.m has shape [3]"),
], ids=["next-obs-shape", "negative-length", "adam-step", "adam-lr", "adam-v", "adam-m"])
def test_a_forged_checkpoint_is_refused_when_loaded(cartpole, tmp_path, edit, words):
    msg = _resume_forged(cartpole, edit, tmp_path)
    assert "checkpoint.pt: does not fit this run" in msg and words in msg


@pytest.mark.parametrize("edit, words", [
    (lambda s: s["obs_norm"].__setitem__("var", -np.ones(3)),
     "normaliser mean / var: non-finite values or a negative variance"),
    (lambda s: s["obs_norm"].__setitem__("count", 0.0), "normaliser count=0.0"),
    (lambda s: s["obs_norm"].__setitem__("mean", np.zeros(5)),
     "normaliser mean / var have shapes [5] / [3]"),
], ids=["negative-var", "zero-count", "other-shape"])
def test_a_forged_normaliser_is_refused_when_loaded(pendulum, tmp_path, edit, words):
    msg = _resume_forged(pendulum, edit, tmp_path)
    assert words in msg


def test_train_refuses_what_is_not_a_config():
    with pytest.raises(UserInputError) as e:
        rl.train({"env": "CartPole-v1"})  # a dict, not a TrainConfig
    assert "config" in one_line(e)


@pytest.mark.parametrize("field, value, words", [
    ("ppo.norm_adv", "bogus", "ppo.norm_adv='bogus': must be one of 'rollout'"),
    ("ppo.update_epochs", True, "ppo.update_epochs=True: must be an integer"),
    ("seed", 1.5, "seed=1.5: must be an integer"),
    ("rollout.norm_obs", "yes", "rollout.norm_obs='yes': must be true or false"),
    ("net.hidden", np.array([64, 64]), "net.hidden=array([64, 64]): must be a list of"),
    ("ppo", {"lr": 1e-3}, "ppo={'lr': 0.001}: must be a PPOConfig"),
    ("env_kwargs", {"lock": threading.Lock()}, "env_kwargs.lock=<unlocked"),
])
def test_train_refuses_a_config_built_in_code_with_a_field_of_another_type(tmp_path, field,
                                                                           value, words):
    """A config built in Python is checked as one read from YAML: each field of its annotated
    type (a choice among its values), in one line, before the run's directory is made."""
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), out=str(tmp_path / "run"),
                              tensorboard=False)
    part, _, name = field.rpartition(".")
    if part:
        setattr(cfg, part, dataclasses.replace(getattr(cfg, part), **{name: value}))
    else:
        cfg = dataclasses.replace(cfg, **{name: value})
    with pytest.raises(UserInputError) as e:
        rl.train(cfg)
    assert words in one_line(e)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("objective", ["nope", 3, ["clip"]])
def test_train_refuses_an_objective_that_is_not_registered(tmp_path, objective):
    """The objective's domain is the registry (a registered objective of one's own trains:
    tests/nn/numpy/test_step.py); anything else is one line naming it."""
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), out=str(tmp_path / "run"),
                              tensorboard=False, objective=objective)
    with pytest.raises(UserInputError) as e:
        rl.train(cfg)
    assert f"objective={objective!r}: must be one of" in one_line(e)
    assert not (tmp_path / "run").exists()
