"""The report of multi-agent runs (issue #11): per-policy learning curves, KL-vs-target panels and
final-return rows (one per condition and policy), from a real tiny sweep of marl/simple_adversary;
single-agent reports keep their exact layout."""

import csv
import html as H
import json
import re
import shutil

import pytest
import yaml

from klppo.cli import main
from klppo.report import make_report
from klppo.report.grid import shown
from klppo.report.load import load_runs, policy_config
from klppo.runs.metrics import read_metrics
from klppo.runs.protocol import final_return
from tests.report.test_report import fake_run

BASE, TIGHT = "base__overrides=[]", "base__overrides=['adversary:kl.target=0.0002']"
POLICIES = ["adversary", "agent"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real sweep of two multi-agent runs: the preset, and the adversary with its own target."""
    pytest.importorskip("mpe2")
    out = tmp_path_factory.mktemp("marl") / "sweep"
    assert main(["sweep", "--preset", "marl/simple_adversary", "--seeds", "0", "--set",
                 "total_steps=4000", "rollout.num_steps=50", "tensorboard=false", "--grid",
                 "marl.overrides=[],[adversary:kl.target=0.0002]", "--out", str(out),
                 "--workers", "2"]) == 0
    return out


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory):
    return make_report([sweep], tmp_path_factory.mktemp("marl-report") / "rep")


def _run_dir(sweep, condition):
    index = json.loads((sweep / "index.json").read_text())
    (name,) = [e["name"] for e in index["runs"] if e["condition"] == condition]
    return sweep / "runs" / name


def test_one_row_per_condition_and_policy_with_each_policys_final_return(sweep, report):
    rep = report
    rows = {(s.condition, s.policy): s for s in rep.summaries}
    assert sorted(rows) == sorted((c, p) for c in (BASE, TIGHT) for p in POLICIES)
    for cond in (BASE, TIGHT):
        records, _ = read_metrics(_run_dir(sweep, cond) / "metrics.jsonl")
        for p in POLICIES:
            assert rows[(cond, p)].per_seed == {0: final_return(records, policy=p)}
            assert rows[(cond, p)].n == 1
    md = (rep.out_dir / "final_returns.md").read_text().splitlines()
    assert md[0] == ("| env | condition | policy | seeds | final return (mean ± std) | "
                     "IQM [95% CI] |")
    assert md[1] == "|---|---|---|---|---|---|"
    row = f"| pettingzoo:mpe2.simple_adversary_v3 | {shown(TIGHT)} | adversary | 1 |"
    assert row in "\n".join(md)
    table = list(csv.DictReader(open(rep.out_dir / "final_returns.csv")))
    assert [(r["condition"], r["policy"]) for r in table] == sorted(rows)
    html = rep.html.read_text()
    assert "<th>policy</th>" in html and "one row per condition and policy" in html
    for p in POLICIES:
        assert f"<td style='text-align:left'>{p}</td>" in html


def test_per_policy_curves_and_kl_panels_with_each_policys_target(sweep, report):
    rep = report
    env = "pettingzoo:mpe2.simple_adversary_v3"
    captions = [c for c, _ in rep.figures]
    for p in POLICIES:
        assert any(c.startswith(f"{env} / policy {p}: learning curves") for c in captions)
        for cond in (BASE, TIGHT):
            assert any(c.startswith(f"{env} / {shown(cond)} / policy {p}: KL vs target and beta, "
                                    "seeds 0.") for c in captions), (p, cond, captions)
    # clip_kl: no partition panel; per policy, the two conditions' aggregates
    assert len(captions) == 8 and sum("IQM" in c for c in captions) == 2
    names = {png.name for _, png in rep.figures}
    assert "pettingzoo-mpe2.simple_adversary_v3__adversary__curves.png" in names
    for _, png in rep.figures:
        assert png.exists() and png.with_suffix(".svg").exists() and ":" not in png.name
    html = rep.html.read_text()
    assert html.count("data:image/png;base64,") == len(rep.figures)
    assert H.escape(f"{env} / {shown(TIGHT)} / policy adversary: KL vs target") in html

    # each panel plots its own policy's KL, target and beta
    from klppo.report import figures as F

    runs = {r.condition: r for r in load_runs([sweep]).runs}
    tight = runs[TIGHT]
    assert tight.policies == POLICIES
    adv, agent = tight.of_policy("adversary"), tight.of_policy("agent")
    assert (F.has_target([adv]), F.has_target([agent])) == (0.0002, 0.01)
    fig = F.kl_tracking(env, f"{TIGHT} / policy adversary", [adv])
    kl_ax, beta_ax = fig.axes
    assert [line.get_label() for line in kl_ax.get_lines()] == ["seed 0", "target 0.0002"]
    raw = tight.metrics
    assert list(beta_ax.get_lines()[0].get_ydata()) == [r["adversary/beta"] for r in raw]
    assert list(kl_ax.get_lines()[0].get_ydata()) == pytest.approx(
        [r["adversary/kl_observed"] for r in raw])
    assert [r["beta"] for r in agent.metrics] == [r["agent/beta"] for r in raw]


def test_run_directories_and_the_cli_give_the_same_rows(sweep, tmp_path, capsys):
    runs = sorted((sweep / "runs").iterdir())
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    # outside a sweep the condition is the config's, with the policy overrides
    assert "| clip_kl[step] | adversary | 1 |" in out
    assert "| clip_kl[step] (adversary:kl.target=0.0002) | agent | 1 |" in out
    assert "report: " in out


def _fake_marl(root, name, objective, seed, returns, overrides=()):
    """A multi-agent run directory with per-policy metrics (policies a, b)."""
    d = root / name
    d.mkdir(parents=True)
    cfg = {"env": "pettingzoo:fake_v0", "objective": objective, "seed": seed,
           "ppo": {"shape": "clip"}, "kl": {"controller": "step", "target": 0.01, "beta": 1.0},
           "marl": {"policies": ["a=a_*", "b=b_*"], "overrides": list(overrides),
                    "env_kwargs": []}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(d / "metrics.jsonl", "w") as f:
        for i, (ra, rb) in enumerate(returns):
            rec = {"iteration": i + 1, "global_step": 100 * (i + 1), "episode_count": 2}
            for p, r in (("a", ra), ("b", rb)):
                rec |= {f"{p}/episode_return_mean": r, f"{p}/kl_rollout": 0.01,
                        f"{p}/kl_observed": 0.01, f"{p}/kl_target": 0.01, f"{p}/beta": 1.0,
                        f"{p}/frac_kill": 0.1, f"{p}/frac_pass": 0.1, f"{p}/frac_in": 0.8,
                        f"{p}/beta_t_q50": 0.0, f"{p}/beta_t_q90": 0.0, f"{p}/beta_t_q99": 0.0}
            f.write(json.dumps(rec) + "\n")
    (d / "status.json").write_text(json.dumps({"state": "finished"}))
    return d


def test_equivalence_is_per_policy_and_mixed_tables_mark_single_agent_rows(tmp_path):
    _fake_marl(tmp_path, "c", "clip", 0, [(1.0, 2.0), (3.0, 4.0)])
    _fake_marl(tmp_path, "p", "per_sample_kl", 0, [(1.0, 2.5), (3.0, 4.0)])
    fake_run(tmp_path, "s", "Env-v0", "clip", 0, [1.0, 2.0])
    rep = make_report([tmp_path], tmp_path / "rep")
    assert {(q.env, q.policy): q.max_abs_diff for q in rep.equivalences} == {
        ("pettingzoo:fake_v0", "a"): 0.0, ("pettingzoo:fake_v0", "b"): 0.5}
    eq = (tmp_path / "rep" / "equivalence.md").read_text().splitlines()
    assert eq[0] == "| env | seed | policy | iterations | max abs diff of return curves |"
    assert "| pettingzoo:fake_v0 | 0 | b | 2 | 0.5 |" in eq
    md = (rep.out_dir / "final_returns.md").read_text()
    assert "| Env-v0 | clip | — | 1 |" in md and "| pettingzoo:fake_v0 | clip | a | 1 |" in md
    captions = [c for c, _ in rep.figures]
    # clip and per_sample_kl of policy b: drawn once where their partitions are the same
    assert any(re.match(r"pettingzoo:fake_v0 / clip( = per_sample_kl)? / policy b: partition "
                        r"\(kill, pass, in\) and \|beta_t\|", c) for c in captions)
    assert any(c.startswith("Env-v0: learning curves") for c in captions)


def test_a_policy_override_changes_that_policys_config_only(tmp_path):
    d = _fake_marl(tmp_path, "r", "clip_kl", 0, [(1.0, 2.0)],
                   overrides=["a:kl.controller=fixed", "a:kl.beta=1e-3", "b:objective=clip",
                              "b:ppo.eps=0.3"])
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    a, b = policy_config(cfg, "a"), policy_config(cfg, "b")
    assert a["kl"] == {"controller": "fixed", "target": 0.01, "beta": 0.001}
    assert a["objective"] == "clip_kl" and b["objective"] == "clip"
    assert b["ppo"] == {"shape": "clip", "eps": 0.3} and b["kl"] == cfg["kl"]
    (run,) = load_runs([d]).runs
    assert run.of_policy("a").objective == "clip_kl" and run.of_policy("b").objective == "clip"
    rep = make_report([d], tmp_path / "rep")
    captions = [c for c, _ in rep.figures]
    # policy a: a fixed beta (no target); policy b: clip, so a partition panel
    assert any("/ policy a: KL and beta (fixed beta: no target)" in c for c in captions)
    assert any("/ policy b: partition" in c for c in captions)


def test_a_single_agent_report_is_unchanged(tmp_path):
    """No policy column, the same file names and table layout as before #11 (the captions
    state the smoothing since #24, which added the aggregates figure; clip and per_sample_kl,
    identical here, share one partition figure since #31)."""
    fake_run(tmp_path, "a", "Env-v0", "clip", 0, [1.0, None, 3.0, 4.0])
    fake_run(tmp_path, "b", "Env-v0", "per_sample_kl", 0, [1.0, None, 3.0, 4.0])
    fake_run(tmp_path, "k", "Env-v0", "kl_penalty", 0, [1.0, 2.0, 3.0, 5.0],
             extra={"kl_observed": 0.03, "kl_target": 0.02}, kl={"controller": "step"})
    rep = make_report([tmp_path], tmp_path / "rep")
    assert all(s.policy is None for s in rep.summaries)
    starts = ["Env-v0: learning curves", "Env-v0 / kl_penalty[step]: KL vs target and beta, "
              "seeds 0.", "Env-v0 / clip = per_sample_kl: partition (kill, pass, in) and "
              "|beta_t|", "Env-v0: IQM"]
    captions = [c for c, _ in rep.figures]
    assert len(captions) == len(starts)
    assert all(c.startswith(s) for c, s in zip(captions, starts)), captions
    assert [png.name for _, png in rep.figures] == [
        "Env-v0__curves.png", "Env-v0__kl_penalty[step]__kl.png", "Env-v0__clip__partition.png",
        "Env-v0__aggregates.png"]
    out = tmp_path / "rep"
    assert (out / "final_returns.md").read_text() == (
        "| env | condition | seeds | final return (mean ± std) | IQM [95% CI] |\n"
        "|---|---|---|---|---|\n"
        "| Env-v0 | clip | 1 | 4.0 ± 0.0 | 4.0 [4.0, 4.0] |\n"
        "| Env-v0 | kl_penalty[step] | 1 | 5.0 ± 0.0 | 5.0 [5.0, 5.0] |\n"
        "| Env-v0 | per_sample_kl | 1 | 4.0 ± 0.0 | 4.0 [4.0, 4.0] |\n")
    assert (out / "final_returns.csv").read_text().splitlines()[0] == \
        "env,condition,seeds,mean,std,iqm,ci_low,ci_high,per_seed"
    assert (out / "equivalence.md").read_text() == (
        "| env | seed | iterations | max abs diff of return curves |\n|---|---|---|---|\n"
        "| Env-v0 | 0 | 4 | 0 |\n")
    assert (out / "equivalence.csv").read_text().splitlines()[0] == \
        "env,seed,iterations,max_abs_diff"
    html = rep.html.read_text()
    assert "policy" not in html and "Multi-agent" not in html
    assert "<h2>Final return</h2><table><tr><th>env</th><th>condition</th><th>seeds</th>" in html
    shutil.rmtree(out)
