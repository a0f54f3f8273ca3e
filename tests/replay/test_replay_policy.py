"""`klppo replay --policy NAME` on a multi-agent run (issue #11): one policy's controller trace,
read from its ``NAME/`` metrics, with its own target."""

import csv
import json

import pytest

from klppo.cli import main
from klppo.replay.lab import load_trace
from klppo.runs.metrics import policies_of
from tests.badinput import assert_one_line_error, run_main, tree

#: the adversary's target is its own (the good agents keep the preset's 0.01)
TARGETS = {"adversary": 0.0002, "agent": 0.01}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real marl/simple_adversary run (RLlib's rule per policy, 10 iterations)."""
    pytest.importorskip("mpe2")
    out = tmp_path_factory.mktemp("marl") / "run"
    assert main(["train", "--preset", "marl/simple_adversary", "--total-steps", "4000",
                 "--rollout.num-steps", "50", "--no-tensorboard", "--marl.overrides",
                 "adversary:kl.target=0.0002", "--out", str(out)]) == 0
    return out


def _records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_replaying_a_policy_with_the_runs_controller_gives_its_logged_betas(run, tmp_path,
                                                                           capsys):
    """The run's controller (step:preset=rllib at P's own target) fed policy P's logged KL
    reproduces P's logged beta trajectory exactly; the two policies' trajectories differ.
    Without ``target=`` the preset keeps its own 0.01 and the replay says so (#24)."""
    recs = _records(run)
    betas = {}
    for p, target in TARGETS.items():
        out = tmp_path / p
        spec = f"step:preset=rllib,target={target:g}"
        assert main(["replay", str(run), "--policy", p, "--controller", spec,
                     "--out", str(out)]) == 0
        assert f"policy {p}: target {target:g} (nats per sample)" in capsys.readouterr().out
        rows = list(csv.DictReader(open(out / "replay.csv")))
        assert [float(r["step"]) for r in rows] == [r["global_step"] for r in recs]
        assert [float(r["kl[trace]"]) for r in rows] == [r[f"{p}/kl_observed"] for r in recs]
        betas[p] = [float(r[f"beta[{spec}]"]) for r in rows]
        assert betas[p] == [r[f"{p}/beta_after"] for r in recs]
        assert (out / "replay.png").stat().st_size > 1000
    assert betas["adversary"] != betas["agent"]
    assert main(["replay", str(run), "--policy", "adversary", "--controller",
                 "step:preset=rllib", "--out", str(tmp_path / "preset")]) == 0
    assert ("note: step:preset=rllib keeps its preset's target 0.01; add target=0.0002 to the "
            "spec") in capsys.readouterr().out
    assert len(set(betas["adversary"])) > 2, betas


def test_load_trace_reads_the_policys_columns_and_target(run):
    recs = _records(run)
    assert policies_of(recs) == ["adversary", "agent"]
    steps, kl, target = load_trace(run, policy="agent")
    assert kl == [r["agent/kl_observed"] for r in recs] and target == 0.01
    assert load_trace(run, "kl_rollout", "adversary")[1:] == (
        [r["adversary/kl_rollout"] for r in recs], 0.0002)
    # the prefixed name is the same column
    assert load_trace(run, "adversary/kl_rollout", "adversary") == \
        load_trace(run, "kl_rollout", "adversary")


@pytest.mark.parametrize("flags, needles", [
    ([], ["multi-agent run", "'adversary', 'agent'", "--policy"]),
    (["--policy", "bob"], ["--policy='bob'", "'adversary', 'agent'"]),
], ids=["no-policy", "unknown-policy"])
def test_a_multi_agent_run_without_a_known_policy_is_one_line(run, tmp_path, capsys, flags,
                                                              needles):
    before = tree(tmp_path)
    rc = run_main(["replay", str(run), *flags, "--out", str(tmp_path / "o")])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "replay", needles)
    assert tree(tmp_path) == before
