"""Evaluation during training (``eval_every``): klppo eval's definition, no effect on training,
the best policy kept, grouped runs as alone."""

import dataclasses

import numpy as np
import pytest
import torch

from klppo import load, rl
from klppo.rl.engine.rundirs import train_batched
from klppo.rl.evaluate import evaluate
from klppo.runs.errors import ConfigError
from tests.rl.test_engine import checkpoint, config, pendulum, same_state, strip

EVAL_KEYS = ("eval_return_mean", "eval_return_std", "eval_length_mean", "eval_best",
             "eval_improved")


def _evaluated(out, **over):
    return dataclasses.replace(config(out, steps=4096, **over), eval_every=3, eval_episodes=3)


@pytest.mark.parametrize("fast_path", [True, False])
def test_evaluating_changes_no_training_number_and_logs_when_due(tmp_path, fast_path):
    plain = rl.train(config(tmp_path / "plain", steps=4096, fast_path=fast_path))
    ev = rl.train(_evaluated(tmp_path / "ev", fast_path=fast_path))
    assert strip(ev.metrics, EVAL_KEYS) == strip(plain.metrics)
    a, b = checkpoint(ev.run_dir), checkpoint(plain.run_dir)
    assert a.pop("eval_best") == max(m["eval_return_mean"] for m in ev.metrics
                                     if "eval_return_mean" in m)
    for s in (a, b):
        s["config"].pop("eval_every"), s["config"].pop("eval_episodes")
    same_state(a, b)
    # every third iteration and the last (8 iterations of 512 steps)
    assert [m["iteration"] for m in ev.metrics if "eval_return_mean" in m] == [3, 6, 8]


def test_an_evaluation_is_klppo_evals_and_the_best_is_kept(tmp_path):
    res = rl.train(dataclasses.replace(_evaluated(tmp_path / "r", seed=1), eval_every=1))
    evals = [m for m in res.metrics if "eval_return_mean" in m]
    returns = [m["eval_return_mean"] for m in evals]
    assert max(returns) > returns[-1], "no evaluation fell below an earlier one: nothing tested"
    best = max(evals, key=lambda m: m["eval_return_mean"])  # the first of equal bests
    assert [m["eval_best"] for m in evals] == list(np.maximum.accumulate(
        [m["eval_return_mean"] for m in evals]))
    kept = torch.load(res.run_dir / "best" / "checkpoint.pt", weights_only=False)
    assert kept["iteration"] == best["iteration"]
    # klppo eval of the kept policy, with the evaluation's episodes: the logged numbers
    again = evaluate(res.run_dir / "best", episodes=3, write=False)
    assert again.mean == best["eval_return_mean"]
    assert float(np.std(again.returns)) == best["eval_return_std"]
    assert load(res.run_dir / "best").config == load(res.run_dir).config
    # the last evaluation is of the final policy: klppo eval of the run says the same
    assert evaluate(res.run_dir, episodes=3, write=False).mean == evals[-1]["eval_return_mean"]


def test_grouped_runs_evaluate_as_alone(tmp_path):
    cfgs = [dataclasses.replace(pendulum(tmp_path / f"g{s}", seed=s), eval_every=2,
                                eval_episodes=2) for s in (0, 1)]
    cfgs[1] = dataclasses.replace(cfgs[1], eval_every=0)  # a group mixing both
    grouped = train_batched(cfgs)
    alone = rl.train(dataclasses.replace(cfgs[0], out=str(tmp_path / "alone")))
    assert strip(grouped[0].metrics) == strip(alone.metrics)
    assert not any("eval_return_mean" in m for m in grouped[1].metrics)
    assert (grouped[0].run_dir / "best" / "checkpoint.pt").is_file()
    assert not (grouped[1].run_dir / "best").exists()


@pytest.mark.parametrize("field, value, message", [
    ("eval_every", -1, r"^eval_every=-1: must be an integer in \[0, 10\*\*9\)"),
    ("eval_episodes", 0, r"^eval_episodes=0: must be an integer in \[1, 1000\]"),
    ("eval_episodes", 10**6, r"^eval_episodes=1000000: must be an integer in \[1, 1000\]"),
])
def test_bad_evaluation_settings_are_one_line(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        rl.train(dataclasses.replace(config(tmp_path / "r"), **{field: value}))
    assert not (tmp_path / "r").exists()


def test_a_multi_agent_run_is_told_to_evaluate_after(tmp_path):
    pytest.importorskip("mpe2")
    c = dataclasses.replace(rl.preset("marl/simple_adversary"), eval_every=2,
                            out=str(tmp_path / "m"))
    with pytest.raises(ConfigError, match=r"^eval_every=2: evaluation during training is for "
                                          r"single-agent runs"):
        rl.train(c)


def test_the_status_line_shows_the_last_evaluation():
    from klppo.cli.train import Progress

    p = Progress(4)
    base = {"global_step": 1, "sps": 1.0, "episode_return_mean": 1.0, "kl_rollout": 0.0,
            "beta": 1.0}
    assert "eval" not in p.line({"iteration": 1, **base})
    assert "eval 12.5" in p.line({"iteration": 2, **base, "eval_return_mean": 12.5})
    assert "eval 12.5" in p.line({"iteration": 3, **base})  # the last one, until the next



def test_the_report_draws_the_evaluations_at_the_steps_every_seed_evaluated():
    from klppo.report.curves import eval_curve

    class R:
        def __init__(self, evals):
            self.metrics = [{"global_step": s, **({} if v is None else {"eval_return_mean": v})}
                            for s, v in evals]

    runs = [R([(10, 1.0), (20, None), (30, 5.0)]), R([(10, 3.0), (20, 4.0), (30, 7.0)])]
    assert eval_curve(runs) == ([10, 30], [2.0, 6.0])
    assert eval_curve([R([(10, None)])]) == ([], [])
