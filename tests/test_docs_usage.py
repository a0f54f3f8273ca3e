"""docs/usage.md works as written. Every `klppo` command of its bash blocks parses; every python
block runs on its own in a fresh namespace, in a directory holding a short `runs/cartpole`.
The slow test runs the whole page in order in one directory: the commands for real (the first
trains `runs/cartpole`; a heredoc writes the user's env module), then the python blocks."""

import os
import re
from pathlib import Path

import pytest
import yaml

from klppo.cli import main
from tests.test_docs_cli import EXTRAS, _blocks, _commands

ROOT = Path(__file__).resolve().parents[1]
USAGE = (ROOT / "docs" / "usage.md").read_text()
COMMANDS = _commands(USAGE)
PY_BLOCKS = _blocks("python", USAGE)


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """A directory holding ``runs/cartpole``: the page's first command, shorter."""
    import dataclasses

    from klppo import rl

    where = tmp_path_factory.mktemp("usage")
    rl.train(dataclasses.replace(rl.preset("klip/cartpole"), total_steps=2048,
                                 tensorboard=False, out=str(where / "runs" / "cartpole")))
    return where


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The commands, run in order in one directory: ``{line: exit status}``."""
    where = tmp_path_factory.mktemp("usage-walk")
    before = os.getcwd()
    os.chdir(where)
    try:
        codes = {}
        for line, argv, files in COMMANDS:
            for name, text in files.items():
                Path(name).write_text(text)
            codes[line] = _run(argv)
        yield where, codes
    finally:
        os.chdir(before)


def test_usage_has_the_sections_and_commands():
    for word in ("## Load", "## Predict and act", "## Evaluate", "## Videos", "## Export",
                 "## Devices", "## Continue training", "## Your own environment"):
        assert word in USAGE
    subs = {argv[0] for _, argv, _ in COMMANDS}
    assert subs == {"train", "eval"} and len(PY_BLOCKS) >= 4
    assert COMMANDS[0][1][:2] == ["train", "--preset"] and "runs/cartpole" in COMMANDS[0][0]


@pytest.mark.parametrize("line, argv, files", COMMANDS, ids=[c[0][:60] for c in COMMANDS])
def test_usage_command_parses(line, argv, files):
    from klppo.cli import build_parser
    from klppo.cli.train import parse_train

    if argv[0] == "train" and "--resume" in argv:
        assert parse_train(argv[1:]).total_steps > 0
    elif argv[0] == "train":
        assert parse_train(argv[1:]).out.startswith("runs/")
    else:
        args = build_parser().parse_args(argv)
        assert args.episodes >= 1


@pytest.mark.slow
def test_usage_page_walked_in_order(workdir):
    """Every command runs, in order, in one directory; then the python blocks run there."""
    _, codes = workdir
    for line, code in codes.items():
        if "--video" in line and code != 0:
            pytest.importorskip("moviepy")
            continue  # this machine cannot render (the command said why in one line)
        assert code == 0, line
    _commands_did_what_the_page_says(workdir)
    for block in PY_BLOCKS:
        try:
            _exec(block, workdir[0])
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in EXTRAS:
                raise


def _commands_did_what_the_page_says(workdir):
    import json

    where, _ = workdir
    run = where / "runs" / "cartpole"
    evals = {p.name for p in run.glob("eval*.json")}
    assert {"eval.json", "eval-2.json"} <= evals  # the second never overwrote the first
    assert json.loads((run / "eval-2.json").read_text())["deterministic"] is False
    assert json.loads((where / "cartpole-eval.json").read_text())["episodes"] == 5
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows]
    n = 12288 // 512
    assert len(rows) == n
    # extended: the iterations after k get the rates of a schedule over the new total
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    k, f = cfg["lr_anneal_from"]
    assert f == pytest.approx(1 - k / n)
    lr0 = cfg["ppo"]["lr"]
    assert lrs[int(k):] == pytest.approx([lr0 * (1 - (i - 1) / n) for i in range(int(k) + 1,
                                                                                n + 1)])
    timed = where / "runs" / "timed-cartpole"
    assert yaml.safe_load((timed / "config.yaml").read_text())["env_kwargs"] == {"limit": 50}
    assert max(json.loads((timed / "eval.json").read_text())["lengths"]) <= 50


@pytest.mark.parametrize("code", PY_BLOCKS, ids=[f"block{i + 1}" for i in range(len(PY_BLOCKS))])
def test_usage_python_block_runs(code, short_run):
    try:
        _exec(code, short_run)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in EXTRAS:
            pytest.skip(f"needs the optional {e.name} package")
        raise


def _exec(code: str, where: Path) -> None:
    cwd = os.getcwd()
    os.chdir(where)
    try:
        exec(compile(code, "docs/usage.md", "exec"), {"__name__": "__usage__"})
    finally:
        os.chdir(cwd)


def test_usage_states_predict_as_stable_baselines3_does():
    text = re.sub(r"\s+", " ", USAGE)
    assert ("predict(observation, state=None, episode_start=None, deterministic=False) -> "
            "(action, state)") in text
    assert "a sampled action unless `deterministic=True`" in text


MIGRATING = (ROOT / "docs" / "migrating.md").read_text()
MIGRATING_COMMANDS = _commands(MIGRATING)


def test_migrating_covers_the_peers():
    for peer in ("## Stable-Baselines3", "## CleanRL", "## RLlib", "## TorchRL", "## trlx",
                 "## TRL"):
        assert peer in MIGRATING
    assert "not yet" not in MIGRATING and "issue #" not in MIGRATING


@pytest.mark.parametrize("line, argv, files", MIGRATING_COMMANDS,
                         ids=[c[0][:70] for c in MIGRATING_COMMANDS])
def test_migrating_command_parses(line, argv, files):
    from tests.test_docs_cli import _check_lm, _check_train

    if argv[0] == "train":
        _check_train(argv[1:])
        from klppo.cli.train import parse_train

        assert parse_train(argv[1:]).env  # a whole, valid config
    else:
        _check_lm(argv)
