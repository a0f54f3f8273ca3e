"""klppo rlhf with the peers' conventions: trlx's flipped k3, its per-token mean over every
position and its fixed-beta fallback; the tutorial's e^d d estimator; the KL monitor."""

import json

import pytest
import torch

from klppo.cli import main
from klppo.lm.experiment import measure_kl
from tests.lm.conftest import TINY


def rlhf(model, out, *flags, iterations=4):
    args = [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY, "iterations": iterations}.items()]
    return main(["rlhf", "--model", str(model), "--out", str(out), *args, *flags])


def metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_trlx_conventions_run_and_say_so(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "trlx"
    assert rlhf(tiny_model_dir, out, "--kl-estimator", "k3_flipped", "--kl-unit",
                "per_token_mean_all", "--controller", "proportional", "--target", "None") == 0
    m = metrics(out)
    assert {r["kl_estimator"] for r in m} == {"k3_flipped"}
    assert len({r["beta"] for r in m}) == 1  # no target: a fixed beta (trlx)
    assert "a fixed beta" in caplog.text and "does not estimate KL" in caplog.text


def test_tutorial_estimator_runs_with_its_warning(tiny_model_dir, tmp_path, caplog):
    assert rlhf(tiny_model_dir, tmp_path / "tut", "--kl-estimator", "tutorial") == 0
    assert metrics(tmp_path / "tut")[-1]["kl_estimator"] == "tutorial"
    assert "tutorial does not estimate KL" in caplog.text


def test_kl_monitor_fires_above_and_below_target(tiny_model_dir, tmp_path, caplog):
    """A target far below the KL reached raises kl_alarm_high, one far above kl_alarm_low."""
    from klppo.lm.config import RLHFConfig
    from klppo.lm.rlhf import rlhf as run

    def reward(prompts, responses):  # a signal the tiny model can follow, so the KL grows
        return [float(len(r) % 3) for r in responses]

    def go(name, target, warmup=0):
        cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / name),
                         **{**TINY, "iterations": 5, "lr": 1e-2, "target": target},
                         kl_estimator="k3", controller="fixed", monitor_patience=2,
                         monitor_warmup=warmup)
        return run(cfg, reward=reward).metrics

    high = go("hi", 1e-12, warmup=5)  # the warm-up holds back "too low" only
    assert all(r["kl"] > 2e-12 for r in high[1:])
    assert [r["kl_alarm_high"] for r in high][2:] == [1.0] * 3
    assert "stayed above 2x its target" in caplog.text
    low = go("lo", 1e9)
    assert [r["kl_alarm_low"] for r in low][1:] == [1.0] * 4
    assert "stayed below 0.5x its target" in caplog.text
    # a warm-up of 2 iterations: counted from iteration 3, so 2 in a row at iteration 4
    late = go("late", 1e9, warmup=2)
    assert [r["kl_alarm_low"] for r in late] == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_per_token_mean_all_counts_padding():
    kl = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert measure_kl(kl, mask, "per_token_mean_all") == pytest.approx(6.0 / 6)
    assert measure_kl(kl, mask, "per_token_mean") == pytest.approx(6.0 / 3)
    assert measure_kl(kl, mask, "per_sequence_sum") == pytest.approx((3.0 + 3.0) / 2)
