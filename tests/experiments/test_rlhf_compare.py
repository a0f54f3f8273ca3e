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
