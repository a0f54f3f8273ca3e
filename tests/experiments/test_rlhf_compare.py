"""The RLHF comparison runs its arms in the experiments' worker pool, like a sweep's runs."""

import json

import pytest

from klppo.experiments.rlhf_compare import arms, run_compare
from klppo.lm.config import RLHFConfig
from tests.lm.conftest import TINY


def test_arms_run_in_the_pool_and_rerunning_skips_finished_ones(tiny_model_dir, tmp_path):
    pytest.importorskip("transformers")
    base = RLHFConfig(model=str(tiny_model_dir), **{**TINY, "iterations": 2})
    configs = arms(base, 0.5, 0.01, "step", [0])
    configs = {k: v for k, v in configs.items() if k.startswith("fixed")}  # two arms
    seen = []
    res = run_compare(configs, tmp_path / "cmp", workers=2,
                      on_done=lambda name, state, err: seen.append((name, state, err)))
    assert res == {name: ("finished", None) for name in configs}, res
    assert sorted(n for n, _, _ in seen) == sorted(configs)
    for name in configs:
        run = tmp_path / "cmp" / "runs" / name
        assert json.loads((run / "status.json").read_text())["state"] == "finished"
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
        assert (run / "worker.log").exists()  # launched by the experiments' worker
    again = run_compare(configs, tmp_path / "cmp", workers=2)
    assert again == res


def _compare(model, out, *flags):
    from tests.badinput import run_main

    return run_main(["rlhf", "compare", "--model", str(model), "--out", str(out), *flags])


SLOW = pytest.mark.slow  # each case starts the CLI (transformers' import): one in the default suite


@pytest.mark.parametrize("holds", ["rlhf run", pytest.param("train run", marks=SLOW),
                                   pytest.param("sweep", marks=SLOW)])
def test_an_out_that_holds_something_else_is_refused_before_anything_is_written(
        holds, tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("transformers")
    from tests.badinput import assert_one_line_error, tree

    out = tmp_path / "o"
    out.mkdir()
    if holds == "sweep":
        (out / "runs").mkdir()
        (out / "spec.yaml").write_text("base: {}\n")
    else:
        (out / "config.yaml").write_text("kind: rlhf\n" if holds == "rlhf run" else "env: x\n")
        (out / "metrics.jsonl").write_text('{"iteration": 1}\n')
    before = tree(tmp_path)
    rc = _compare(tiny_model_dir, out)
    kind = "sweep" if holds == "sweep" else "run"
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf compare",
                          [f"--out={str(out)!r}", f"holds a {kind}", "not a comparison"])
    assert tree(tmp_path) == before


def test_a_comparison_started_with_other_settings_is_refused(tiny_model_dir, tmp_path, capsys):
    """Its arms' pending configs name the settings they started with: a rerun with other
    settings would report the old arms' results as its own."""
    pytest.importorskip("transformers")
    from tests.badinput import assert_one_line_error, tree

    base = RLHFConfig(model=str(tiny_model_dir), **{**TINY, "iterations": 1})
    configs = arms(base, 0.5, 0.01, "step", [0])
    run_compare({k: v for k, v in list(configs.items())[:1]}, tmp_path / "cmp", workers=1)
    before = tree(tmp_path)
    rc = _compare(tiny_model_dir, tmp_path / "cmp", "--iterations", "2", "--strong-beta",
                  "0.5", "--weak-beta", "0.01", "--adaptive", "step", "--target", "1.0",
                  *[x for k, v in TINY.items() if k not in ("iterations", "target")
                    for x in ("--set", f"{k}={v}")])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf compare",
                          ["--out=", "fixed_strong__0", "iterations=1", "not 2"])
    assert tree(tmp_path) == before
    from klppo.cli.rlhf_compare import _check_out

    _check_out(str(tmp_path / "cmp"), configs)  # the same settings: it continues there


@pytest.mark.parametrize("text", ["- a list\n", pytest.param("lr: [1\n", marks=SLOW),
                                  pytest.param("", marks=SLOW)])
def test_a_damaged_arm_config_in_out_is_one_line(text, tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("transformers")
    from klppo.experiments.rlhf_worker import PENDING
    from tests.badinput import assert_one_line_error

    arm = tmp_path / "o" / "runs" / "fixed_strong__0"
    arm.mkdir(parents=True)
    (arm / PENDING).write_text(text)
    rc = _compare(tiny_model_dir, tmp_path / "o")
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf compare", [str(arm / PENDING)])
