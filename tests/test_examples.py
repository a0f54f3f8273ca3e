"""The files in examples/ (the guide's my.yaml, sweep.yaml and rlhf.yaml, the TRL tutorial's
trl_minimal.py) work."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from klppo.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def test_train_with_examples_my_yaml(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "klip/cartpole", "--config", str(EXAMPLES / "my.yaml"),
                 "--total-steps", "1024", "--out", str(out), "--no-tensorboard"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    mine = yaml.safe_load((EXAMPLES / "my.yaml").read_text())
    assert saved["total_steps"] == 1024  # the flag wins over the file
    assert saved["objective"] == mine["objective"] and saved["ppo"]["lr"] == mine["ppo"]["lr"]
    assert {k: saved["kl"][k] for k in mine["kl"]} == mine["kl"]
    assert "status: finished" in capsys.readouterr().out


def test_examples_sweep_yaml_is_the_readme_flag_sweep():
    from klppo.cli.sweep import spec_from_args
    from klppo.experiments.sweep import expand, load_spec

    plans = expand(load_spec(EXAMPLES / "sweep.yaml"))
    assert len(plans) == 18 and len({p.name for p in plans}) == 18
    assert {p.config.ppo.lr for p in plans} == {0.0003, 0.001}
    assert {p.config.objective for p in plans} == {"clip", "per_sample_kl", "kl_penalty"}
    flags = build_parser().parse_args(
        ["sweep", "--out", "x", "--objectives", "clip", "per_sample_kl", "kl_penalty",
         "--seeds", "0", "1", "2", "--set", "total_steps=51200", "--grid",
         "ppo.lr=0.0003,0.001"])
    by_flags = {p.name: dataclasses.asdict(p.config) for p in expand(spec_from_args(flags))}
    assert {p.name: dataclasses.asdict(p.config) for p in plans} == by_flags


def test_examples_rlhf_yaml_is_a_valid_rlhf_config():
    from klppo.lm.config_checks import config_from_dict
    from klppo.runs.configfile import read_config_file

    cfg = config_from_dict(read_config_file(str(EXAMPLES / "rlhf.yaml"), "config"))
    assert cfg.controller == "proportional" and cfg.target == 6.0


@pytest.mark.parametrize("folder, version, suffix", [("mujoco-1m", "v4", ""),
                                                     ("mujoco-v5-1m", "v5", "-v5")])
def test_examples_mujoco_1m_specs_are_the_demo_comparison_per_task(folder, version, suffix):
    """examples/mujoco-1m is the paper's table (v4); examples/mujoco-v5-1m the committed v5 one."""
    from klppo.experiments.sweep import expand, load_spec
    from klppo.experiments.sweep_spec import DEMO_SPEC

    tasks = {"halfcheetah": "HalfCheetah", "hopper": "Hopper", "walker2d": "Walker2d",
             "ant": "Ant", "humanoid": "Humanoid"}
    assert {p.stem for p in (EXAMPLES / folder).glob("*.yaml")} == set(tasks)
    for stem, env in tasks.items():
        spec = load_spec(EXAMPLES / folder / f"{stem}.yaml")
        assert spec.preset == f"klip/{stem}{suffix}" and spec.conditions == DEMO_SPEC.conditions
        plans = expand(spec)
        assert len(plans) == 20 and {p.seed for p in plans} == set(range(5))
        assert {(p.config.env, p.config.total_steps) for p in plans} == \
            {(f"{env}-{version}", 1_000_000)}


@pytest.mark.slow
def test_trl_grpo_adaptive_kl_tiny_writes_the_rlhf_report(tmp_path, capsys):
    """examples/trl_grpo_adaptive_kl.py --tiny: four GRPO arms through TRL, the run files of
    `klppo rlhf compare` and its report; fixed arms keep beta, adaptive arms follow the rule."""
    pytest.importorskip("trl")
    import importlib.util
    import sys

    from klppo.core.controllers import make_controller, relative_pid_gains
    from klppo.runs.metrics import read_metrics

    spec = importlib.util.spec_from_file_location("trl_grpo", EXAMPLES / "trl_grpo_adaptive_kl.py")
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its dataclasses look the module up
    spec.loader.exec_module(example)
    assert example.main(["--tiny", "--out", str(tmp_path), "--steps", "24"]) == 0
    s = dataclasses.replace(example.TINY, steps=24)
    n = s.prompts_per_step * s.completions_per_prompt
    arms = {"fixed_strong": s.strong_beta, "adaptive_from_strong": s.strong_beta,
            "fixed_weak": s.weak_beta, "adaptive_from_weak": s.weak_beta}
    for arm, beta in arms.items():
        recs, bad = read_metrics(tmp_path / "runs" / f"{arm}__0" / "metrics.jsonl")
        assert bad == 0 and [r["iteration"] for r in recs] == list(range(1, s.steps + 1))
        assert [r["iteration"] for r in recs if "held_out_perplexity" in r] == [1, 24]
        assert all(len(r["samples"]) == 4 for r in recs if "samples" in r)
        # the adaptive arms: the PID rule with gains relative to the target, no hold (the
        # example's default), replayed from its formula on the logged KLs
        assert s.controller == "pid"
        ctrl = make_controller("fixed", beta=beta) if arm.startswith("fixed") else \
            make_controller("pid", beta=beta, target=s.target, beta_min=1e-4,
                            **relative_pid_gains(s.target))
        for r in recs:
            assert r["beta"] == ctrl.value and r["kl_unit"] == s.unit
            ctrl.update(r["kl"], n_steps=n)
            assert r["beta_after"] == ctrl.value
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert all(f"| {arm} | 1 |" in summary for arm in arms)
    assert (tmp_path / "report" / "report.html").is_file()
    out = capsys.readouterr().out
    assert "report:" in out and "against the target 0.05" in out


@pytest.mark.slow  # 200 GRPO steps (about 40 s)
def test_trl_minimal_drives_beta_with_a_controller(tmp_path):
    """examples/trl_minimal.py as its docstring runs it (on a tiny local model): GRPO trains
    200 steps and the last line sets the second-half KL beside the target."""
    pytest.importorskip("trl")
    import os
    import subprocess
    import sys

    from tests.lm.conftest import make_tiny_model

    model = make_tiny_model(tmp_path / "model")
    # nothing may leave the machine (TRL's trainers report their use to huggingface.co unless
    # told not to): a name lookup is recorded and refused
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(
        "import socket\n"
        "def _refuse(host, *a, **k):\n"
        f"    open({str(tmp_path / 'lookups')!r}, 'a').write(str(host) + '\\n')\n"
        "    raise OSError('no network in this test')\n"
        "socket.getaddrinfo = _refuse\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(spy), str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(EXAMPLES / "trl_minimal.py"), str(model)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "lookups").exists(), (tmp_path / "lookups").read_text()
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("second-half KL ")]
    assert "nats/token against the target 0.05" in line and "after 200 steps" in line
    assert float(line.split()[2]) >= 0  # (the test's tiny model need not reach the target)



@pytest.mark.slow  # ten worker processes (about 1 min quiet)
def test_rlhf_controls_runs_every_arm_and_tabulates_the_mismatch(tmp_path):
    """examples/rlhf_controls.py: every arm is a valid config; three tiny iterations of each
    finishes, and the table names every arm with the sampler mismatch where there is one."""
    pytest.importorskip("transformers")
    import importlib.util

    from klppo.experiments.rlhf_compare import run_compare
    from klppo.report.lm import lm_report
    from tests.lm.conftest import TINY, make_tiny_model

    spec = importlib.util.spec_from_file_location("controls", EXAMPLES / "rlhf_controls.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = make_tiny_model(tmp_path / "tiny")
    tiny = {**TINY, "iterations": 3}
    cfgs = {name: dataclasses.replace(c, **tiny) for name, c in
            example.configs(str(model), 150, [0]).items()}
    assert sorted(n.split("__")[0] for n in cfgs) == sorted(example.ARMS)
    results = run_compare(cfgs, tmp_path / "out", workers=1)
    assert {state for state, _ in results.values()} == {"finished"}, results
    _, summaries = lm_report(tmp_path / "out", tmp_path / "out" / "report")
    rows = example.controls_table(tmp_path / "out", summaries).splitlines()[2:]
    assert sorted(r.split(" | ")[0][2:] for r in rows) == sorted(example.ARMS)
    bf16 = next(r for r in rows if r.startswith("| bf16_tis "))
    assert bf16.split(" | ")[-2] != "-" and float(bf16.split(" | ")[-2]) > 0
    assert next(r for r in rows if r.startswith("| reward_k1 ")).split(" | ")[-2] == "-"


def test_the_trl_tutorial_shows_trl_minimal_as_it_is():
    """docs/tutorials/trl.md prints examples/trl_minimal.py without its docstring: the same."""
    page = (ROOT / "docs" / "tutorials" / "trl.md").read_text()
    shown = page.split("`examples/trl_minimal.py`, without its docstring:\n\n```py\n", 1)[1]
    shown = shown.split("```", 1)[0]
    body = (EXAMPLES / "trl_minimal.py").read_text().split('"""', 2)[2].lstrip("\n")
    assert shown == body
