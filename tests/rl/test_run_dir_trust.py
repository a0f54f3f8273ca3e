"""A run directory is data, never code, and a resume checks its files against each other
before touching any of them (issue #19): a forged checkpoint runs nothing; an edited config, a
checkpoint of another run, damaged metadata or metrics are refused in one line, exit 2, with
config.yaml, checkpoint.pt and metrics.jsonl left as they were."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import klppo
import klppo.rl as rl
from tests.badinput import run_main


def _small(out: Path, **kw) -> rl.TrainConfig:
    c = rl.preset("klip/cartpole")
    return dataclasses.replace(c, out=str(out), total_steps=2048, tensorboard=False,
                               checkpoint_every=1, **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Finished runs to copy: the base, one with another seed, one with other layer sizes."""
    root = tmp_path_factory.mktemp("runs")
    made = {"base": _small(root / "base"), "seed1": _small(root / "seed1", seed=1),
            "hidden32": _small(root / "hidden32")}
    made["hidden32"].net = dataclasses.replace(made["hidden32"].net, hidden=(32, 32))
    for cfg in made.values():
        rl.train(cfg)
    return {k: Path(c.out) for k, c in made.items()}


class Evil:
    """Unpickling this would create ``path`` (what a forged checkpoint could do with a shell)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _forge(run: Path, marker: Path) -> None:
    state = torch.load(run / "checkpoint.pt", weights_only=False)  # the test trusts its own run
    state["extra"] = Evil(marker)
    torch.save(state, run / "checkpoint.pt")


def test_the_forgery_would_run_code_if_unpickled(runs, tmp_path):
    """The test's forgery is real: an ordinary unpickle creates the marker."""
    run, marker = tmp_path / "r", tmp_path / "ran"
    shutil.copytree(runs["base"], run)
    _forge(run, marker)
    torch.load(run / "checkpoint.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("reader", ["resume", "eval", "load", "rlhf_reader"])
def test_a_forged_checkpoint_runs_nothing(reader, runs, tmp_path, capsys):
    run, marker = tmp_path / "r", tmp_path / "ran"
    shutil.copytree(runs["base"], run)
    _forge(run, marker)
    if reader == "resume":
        assert run_main(["train", "--resume", str(run)]) == 2
    elif reader == "eval":
        assert run_main(["eval", str(run), "--episodes", "1"]) == 2
    elif reader == "load":
        from klppo.runs.checkpoint import CheckpointError

        with pytest.raises(CheckpointError, match="refused"):
            klppo.load(run)
    else:
        from klppo.lm.rlhf import ResumeError, read_checkpoint

        with pytest.raises(ResumeError, match="refused"):
            read_checkpoint(run / "checkpoint.pt")
    err = capsys.readouterr().err
    assert not marker.exists()
    if reader in ("resume", "eval"):
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "refused" in lines[0] and "checkpoint.pt" in lines[0], err


def _edit_config(run: Path, **changes) -> None:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    for key, value in changes.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _checkpoint_of(other: str):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        shutil.copy(runs[other] / "checkpoint.pt", run / "checkpoint.pt")
    return damage


def _old_style_checkpoint_of(other: str):
    """A checkpoint of another run written before checkpoints held their config."""
    def damage(run: Path, runs: dict[str, Path]) -> None:
        state = torch.load(runs[other] / "checkpoint.pt", weights_only=False)
        del state["config"]
        torch.save(state, run / "checkpoint.pt")
    return damage


def _edit_state(**changes):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        state = torch.load(run / "checkpoint.pt", weights_only=False)
        for key, value in changes.items():
            if value is KeyError:
                del state[key]
            elif value is None and key == "agent":  # the same weights, stored as float64
                state[key] = {k: v.double() for k, v in state[key].items()}
            else:
                state[key] = value
        torch.save(state, run / "checkpoint.pt")
    return damage


def _poison(*keys: str, value: float = float("nan")):
    """Set one entry of the checkpoint (a tensor or array: all of it) to a non-finite value."""
    def damage(run: Path, runs: dict[str, Path]) -> None:
        state = torch.load(run / "checkpoint.pt", weights_only=False)
        node = state
        for k in keys[:-1]:
            node = node[k]
        old = node[keys[-1]]
        node[keys[-1]] = (torch.full_like(old, value) if isinstance(old, torch.Tensor) else
                          np.full_like(old, value) if isinstance(old, np.ndarray) else value)
        torch.save(state, run / "checkpoint.pt")
    return damage


def _set(*keys: str, value):
    """Set one nested entry of the checkpoint to ``value`` (a forged number)."""
    def damage(run: Path, runs: dict[str, Path]) -> None:
        state = torch.load(run / "checkpoint.pt", weights_only=False)
        node = state
        for k in keys[:-1]:
            node = node[k]
        assert keys[-1] in node, keys  # (the forgery replaces what is there)
        node[keys[-1]] = value
        torch.save(state, run / "checkpoint.pt")
    return damage


def _insert_line(after: int, text: str):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        lines.insert(after, text)
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return damage


def _metrics_field(n: int, **fields):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        lines[n] = json.dumps({**json.loads(lines[n]), **fields})
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return damage


def _lock_link(run: Path, runs: dict[str, Path]) -> None:
    victim = run.parent / "victim.txt"
    victim.write_text("precious")
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(victim)


def _write(name: str, text: str):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        (run / name).write_text(text)
    return damage


def _metrics_line(n: int, iteration):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        rec = json.loads(lines[n])
        rec["iteration"] = iteration
        lines[n] = json.dumps(rec)
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return damage


def _config(**changes):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        _edit_config(run, **changes)
    return damage


def _delete(name: str):
    def damage(run: Path, runs: dict[str, Path]) -> None:
        (run / name).unlink()
    return damage


#: case -> (damage, text the one line must hold)
REFUSED = {
    "hidden_edited": (_config(**{"net.hidden": [32, 32]}), "net.hidden=[32, 32]"),
    "env_edited": (_config(env="Acrobot-v1"), "env='Acrobot-v1'"),
    "objective_edited": (_config(objective="kl_penalty"), "objective='kl_penalty'"),
    "total_steps_edited": (_config(total_steps=4096), "total_steps=4096"),
    "seed_edited": (_config(seed=7), "seed=7"),
    "lr_edited": (_config(**{"ppo.lr": 0.1}), "ppo.lr=0.1"),
    "checkpoint_of_another_seed": (_checkpoint_of("seed1"), "seed=0"),
    "checkpoint_of_other_layers": (_checkpoint_of("hidden32"), "net.hidden"),
    "old_checkpoint_of_other_layers": (_old_style_checkpoint_of("hidden32"),
                                       "actor.0.weight is [32, 4] in the checkpoint, [64, 4]"),
    "checkpoint_missing_collector": (_edit_state(collector=KeyError), "does not fit"),
    "checkpoint_missing_agent": (_edit_state(agent=KeyError), "does not fit"),
    "checkpoint_agent_not_a_dict": (_edit_state(agent=3), "does not fit"),
    "checkpoint_iteration_string": (_edit_state(iteration="2"), "not a klppo training"),
    "checkpoint_iteration_negative": (_edit_state(iteration=-1), "not a klppo training"),
    "checkpoint_step_off": (_edit_state(global_step=5), "global step 5"),
    "checkpoint_config_not_a_mapping": (_edit_state(config=[1, 2]), "not a mapping"),
    "checkpoint_rng_unknown_generator": (_edit_state(env={"kind": "cartpole", "state": 0}),
                                         "does not fit"),
    "checkpoint_deleted": (_delete("checkpoint.pt"), "checkpoint.pt: missing"),
    "metadata_a_list": (_write("metadata.json", "[1, 2]"), "metadata.json: holds list"),
    "metadata_resumes_int": (_write("metadata.json", '{"resumes": 5}'), "resumes=5"),
    "metadata_not_json": (_write("metadata.json", "{"), "metadata.json: unreadable"),
    "metadata_of_rlhf": (_write("metadata.json", '{"kind": "rlhf"}'), "kind='rlhf'"),
    "metadata_resumes_not_records": (_write("metadata.json", '{"resumes": [1, 2]}'),
                                     "resumes=[1, 2]"),
    "metrics_iteration_null": (_metrics_line(1, None), "iteration=None"),
    "metrics_iteration_string": (_metrics_line(1, "abc"), "iteration='abc'"),
    "metrics_iteration_float": (_metrics_line(1, 1.0), "iteration=1.0"),
    "metrics_iteration_bool": (_metrics_line(0, True), "iteration=True"),
    "metrics_iteration_zero": (_metrics_line(0, 0), "iteration=0"),
    "weights_nan": (_poison("agent", "actor.0.weight"), "agent.actor.0.weight holds a non-finite"),
    "weights_inf": (_poison("agent", "actor.4.bias", value=float("inf")), "agent.actor.4.bias"),
    "optimizer_moment_nan": (_poison("optimizer", "v"), "non-finite"),
    "episode_sums_nan": (_poison("collector", "ep_return"), "collector.ep_return"),
    "controller_beta_nan": (_poison("controller", "beta"), "controller.beta"),
    "metadata_nested_deeply": (_write("metadata.json", "[" * 100_000 + "]" * 100_000),
                               "metadata.json: unreadable"),
    "metrics_line_nested_deeply": (_insert_line(2, "[" * 100_000 + "]" * 100_000),
                                   "line 3 is not a metrics record"),
    "metrics_junk_line": (_insert_line(1, "[1]"), "line 2 is not a metrics record"),
    "metrics_global_step_edited": (_metrics_field(1, global_step=999), "global_step=999"),
    "lock_is_a_link": (_lock_link, "not a plain file"),
    "weights_float64": (_edit_state(agent=None), "is torch.float64 in the checkpoint"),
    # integers too large for numpy's or torch's types (an OverflowError was a traceback)
    "optimizer_step_overflow": (_set("optimizer", "t", value=10**30), "OverflowError"),
    "env_rng_overflow": (_set("env", "rng", "state", "state", value=2**300), "does not fit"),
    "env_rng_negative": (_set("env", "rng", "state", "state", value=-1), "does not fit"),
    "runner_rng_overflow": (_set("collector", "runner", "numpy_rng", "state", "inc",
                                 value=2**300), "does not fit"),
}


def _snapshot(run: Path) -> dict[str, bytes]:
    return {n: (run / n).read_bytes() for n in ("config.yaml", "checkpoint.pt", "metrics.jsonl")
            if (run / n).exists()}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_resume_of_mismatched_files_is_refused_in_one_line(case, runs, tmp_path, capsys):
    damage, needle = REFUSED[case]
    run = tmp_path / "r"
    shutil.copytree(runs["base"], run)
    damage(run, runs)
    before = _snapshot(run)
    try:
        was = json.loads((run / "status.json").read_text())["iteration"]
    except (OSError, ValueError, KeyError, TypeError):
        was = 0
    capsys.readouterr()
    assert run_main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("klppo train: "), err
    assert needle in lines[0] and "Traceback" not in err, lines[0]
    assert _snapshot(run) == before
    if case == "lock_is_a_link":  # refused before the lock: status.json is not ours to write
        assert (run.parent / "victim.txt").read_text() == "precious"
        return
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["error"] == lines[0][len("klppo train: "):]
    assert status["iteration"] == (was if type(was) is int else 0)  # the run's, kept


@pytest.mark.parametrize("change", [{"checkpoint_every": 3}, {"tensorboard": True},
                                    {"torch_threads": 2}])
def test_a_resume_takes_the_changes_a_user_may_make(change, runs, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(runs["base"], run)
    _edit_config(run, total_steps=2048, **change)
    res = rl.resume(run)
    assert res.status == "finished" and len(res.metrics) == 4


def test_a_run_killed_before_its_first_checkpoint_restarts(runs, tmp_path):
    """No checkpoint yet is not damage when the metrics stop before the first checkpoint."""
    run = tmp_path / "r"
    shutil.copytree(runs["base"], run)
    _edit_config(run, checkpoint_every=8)
    (run / "checkpoint.pt").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    res = rl.resume(run)
    assert res.status == "finished"
    full = [json.loads(x) for x in (runs["base"] / "metrics.jsonl").read_text().splitlines()]
    drop = rl.trainer.TIMING_KEYS
    assert [{k: v for k, v in r.items() if k not in drop} for r in res.metrics] == \
        [{k: v for k, v in r.items() if k not in drop} for r in full]


@pytest.mark.parametrize("reader", ["eval", "load"])
def test_non_finite_weights_are_refused_by_eval_and_load(reader, runs, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(runs["base"], run)
    _poison("agent", "actor.0.weight")(run, runs)
    if reader == "eval":
        assert run_main(["eval", str(run), "--episodes", "1"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "actor.0.weight holds a non-finite value" in line
    else:
        from klppo.runs.checkpoint import CheckpointError

        with pytest.raises(CheckpointError, match="non-finite"):
            klppo.load(run)


def test_a_checkpoint_older_than_a_config_field_resumes_at_its_default(tmp_path):
    """A field added to the config after a checkpoint was written is absent from it: the
    checkpoint ran with the field's default (every new field's default keeps the old
    behaviour), so config.yaml at the default resumes and any other value is refused."""
    from klppo.rl.config import TrainConfig, to_dict
    from klppo.rl.lifecycle import ResumeError, _check_config

    cfg = TrainConfig()
    saved = to_dict(cfg)
    del saved["kl"]["monitor_patience"], saved["ppo"]["ent_coef"]
    _check_config(tmp_path, cfg, saved, extending=False)  # both at their defaults
    edited = dataclasses.replace(cfg, kl=dataclasses.replace(cfg.kl, monitor_patience=5))
    with pytest.raises(ResumeError, match=r"kl.monitor_patience=5 but the checkpoint was made "
                                          r"with 3"):
        _check_config(tmp_path, edited, saved, extending=False)
