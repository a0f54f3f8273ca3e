"""Controller state files written by the integrations (verl's, TRL's) are validated like
checkpoints when read back: types, finiteness, bounds and nesting depth, each refusal one line
naming the file and the field; API arguments that are not numbers name the argument. None of
this needs verl or TRL installed."""

import json

import pytest

from klppo.integrations.verl import RewardKLControl, VerlIntegrationError

RULE = {"controller": "proportional", "beta": 0.1, "target": 6.0, "beta_min": 0.01,
        "horizon": 1000}


def _saved(tmp_path, rule=RULE, **controller):
    """A controller's state saved after one update, with ``controller`` fields overwritten."""
    ctrl = RewardKLControl(**rule)
    ctrl.update(7.0, 32)
    folder = tmp_path / "global_step_1"
    folder.mkdir()
    path = ctrl.save(folder, 1)
    state = json.loads(path.read_text())
    state["controller"].update(controller)
    path.write_text(json.dumps(state, allow_nan=True))
    return folder, path


@pytest.mark.parametrize("field, value, needle", [
    ("beta", float("nan"), "beta=nan: must be a finite number in [beta_min, beta_max]"),
    ("beta", -5.0, "beta=-5.0: must be a finite number in [beta_min, beta_max] = [0.01, inf]"),
    ("beta", "abc", "beta='abc'"),
    ("num_updates", -1, "num_updates=-1: must be an integer >= 0"),
    ("num_updates", 1.5, "num_updates=1.5"),
    ("info", [1, 2], "info=list: must be a mapping or null"),
    ("info", {"nope": 1}, "info: "),
    ("reached", "yes", "reached='yes': must be true or false"),
])
def test_a_bad_saved_controller_is_refused_naming_the_file_and_field(tmp_path, field, value,
                                                                      needle):
    folder, path = _saved(tmp_path, **{field: value})
    fresh = RewardKLControl(**RULE)
    with pytest.raises(RuntimeError) as e:
        fresh.load(folder, 1)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and needle in msg, msg
    assert fresh.value == 0.1  # nothing half-loaded


def test_a_controller_saved_as_a_list_or_nested_without_end_is_refused(tmp_path):
    folder, path = _saved(tmp_path)
    state = json.loads(path.read_text())
    fresh = RewardKLControl(**RULE)
    path.write_text(json.dumps({**state, "controller": [1, 2, 3]}))
    with pytest.raises(RuntimeError, match="controller: state_dict must be a mapping, got list"):
        fresh.load(folder, 1)
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(RuntimeError, match=r"unreadable \(nested too deeply\)"):
        fresh.load(folder, 1)


def test_a_pid_state_is_checked_too(tmp_path):
    pid = {"controller": "pid", "beta": 0.1, "target": 6.0, "kp": 0.1, "ki": 0.01}
    folder, _ = _saved(tmp_path, pid, integral=float("inf"))
    with pytest.raises(RuntimeError, match="integral=inf: must be a finite number"):
        RewardKLControl(**pid).load(folder, 1)


@pytest.mark.parametrize("kl, n, needle", [("abc", 8, "current_kl='abc'"),
                                           (float("nan"), 8, "current_kl=nan"),
                                           (1.0, "8", "n_steps='8'"), (1.0, 0, "n_steps=0"),
                                           (True, 8, "current_kl=True")])
def test_update_names_the_argument(kl, n, needle):
    ctrl = RewardKLControl("proportional", beta=0.1, target=6.0, horizon=1000)
    with pytest.raises(VerlIntegrationError, match=needle):
        ctrl.update(kl, n)
    assert ctrl.value == 0.1 and not ctrl.history


def test_attach_names_a_kl_coef_that_is_not_a_number():
    from types import SimpleNamespace

    from klppo.integrations.verl import attach

    cfg = SimpleNamespace(algorithm=SimpleNamespace(use_kl_in_reward=True,
                                                    kl_ctrl=SimpleNamespace(kl_coef="abc")))
    with pytest.raises(VerlIntegrationError, match="algorithm.kl_ctrl.kl_coef='abc': must be a "
                                                   "finite number"):
        attach(SimpleNamespace(config=cfg), "proportional", target=6.0)
