"""Bad input to ``klppo sweep`` / ``klppo demo``: one line on stderr, exit code 2, no traceback,
and nothing created."""

import subprocess
import sys
from pathlib import Path

import pytest

from klppo.cli import main
from klppo.runs import rundir as R
from tests.badinput import run_main

ROOT = Path(__file__).resolve().parents[2]
GOOD = "base: {total_steps: 1024, tensorboard: false}\nseeds: [0]\n"
#: a "billion laughs" document: 9 levels of 9 aliases
BOMB = "a: &a [lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

#: (id, spec file text (bytes: raw; None: no --spec), extra flags, the message's start)
SPEC_CASES = [
    ("condition-name-nul", 'conditions:\n  "a\\0b": {objective: clip}\n', [],
     "conditions='a\\x00b': a condition name names run directories"),
    ("condition-name-long", "conditions:\n  " + "c" * 300 + ": {objective: clip}\n", [],
     "conditions='cccc"),
    ("field-dotted-and-nested", "conditions:\n  a: {ppo.lr: 0.1, ppo: {lr: 0.2}}\n", [],
     "conditions.a.ppo.lr=0.2: is given twice"),
    ("env-discrete-observations", "grid: {env: [CartPole-v1, FrozenLake-v1]}\n", [],
     "condition base: env='FrozenLake-v1': observation space Discrete(16)"),
    ("grid-value-twice", "grid: {ppo.lr: [0.1, 0.10000000000000001]}\n", [],
     "grid.ppo.lr=[0.1, 0.1]: the value 0.1 is given twice"),
    ("seeds-scalar", "seeds: 0\n", [], "seeds=0: must be a non-empty list"),
    ("seeds-not-int", "seeds: [0, a]\n", [], "seeds=[0, 'a']: "),
    ("seeds-float", "seeds: [0.5]\n", [], "seeds=[0.5]: "),
    ("seeds-bool", "seeds: [true]\n", [], "seeds=[True]: "),
    ("seeds-negative", "seeds: [-1]\n", [], "seeds=[-1]: "),
    ("seeds-empty", "seeds: []\n", [], "seeds=[]: "),
    ("seeds-duplicate", "seeds: [1, 1]\n", [], "seeds=[1, 1]: "),
    ("missing-file", None, ["--spec", "{tmp}/nope.yaml"], "spec='{tmp}/nope.yaml': no such file"),
    ("spec-is-dir", None, ["--spec", "{tmp}"], "spec='{tmp}': is a directory"),
    ("empty-file", "", [], "spec='{spec}': is empty"),
    ("only-comments", "# nothing\n", [], "spec='{spec}': is empty"),
    ("bad-yaml", "seeds: [0, 1\n", [], "spec='{spec}': not valid YAML at line "),
    ("not-utf8", b"seeds: [0]\n# \xff\xfe\n", [], "spec='{spec}': not UTF-8 text (byte 0xff"),
    ("top-level-list", "- a\n- b\n", [], "spec='{spec}': holds a list"),
    ("top-level-scalar", "42\n", [], "spec='{spec}': holds a int"),
    ("unknown-key", "seed: [0]\n", [], "seed=[0]: unknown sweep spec key"),
    ("conditions-list", "conditions: [a, b]\n", [], "conditions=['a', 'b']: must be a mapping"),
    ("condition-not-mapping", "conditions: {clip: 3}\n", [], "conditions.clip=3: must be a "),
    ("grid-not-list", "grid: {ppo.lr: 0.1}\n", [], "grid.ppo.lr=0.1: must be a non-empty list"),
    ("grid-empty-list", "grid: {ppo.lr: []}\n", [], "grid.ppo.lr=[]: must be a non-empty list"),
    ("grid-list", "grid: [a]\n", [], "grid=['a']: must be a mapping"),
    ("preset-unknown", "preset: nope\n", [], "preset='nope': unknown"),
    ("preset-not-str", "preset: 3\n", [], "preset=3: must be a preset name"),
    ("base-list", "base: [1]\n", [], "base=[1]: must be a mapping"),
    ("base-unknown-field", "base: {ppo.nope: 1}\n", [], "base.ppo.nope=1: unknown config field"),
    ("base-conflict", "base: {ppo: 1, ppo.lr: 1}\n", [], "base.ppo.lr=1: conflicts with ppo=1"),
    ("base-bad-value", "base: {total_steps: -5}\n", [], "total_steps=-5: must be an integer"),
    # the field is named once config.from_dict checks types; till then validate's TypeError
    ("base-bad-type", "base: {ppo.lr: fast}\n", [], ""),
    ("grid-bad-type", "grid: {ppo.lr: [fast]}\n", [], ""),
    ("hidden-bad-type", "base: {net.hidden: 3}\n", [], "base"),
    ("condition-bad-value", "conditions: {c: {objective: nope}}\n", [],
     "conditions.c.objective='nope': must be one of"),
    # issue 19: the last of two equal keys won silently
    ("duplicate-condition", "conditions:\n  a: {objective: clip}\n  a: {objective: clip_kl}\n",
     [], "spec='{spec}': not valid YAML at line 3, column 3: duplicate key 'a'"),
    ("duplicate-base", "base: {total_steps: 1024}\nbase: {total_steps: 2048}\n", [],
     "spec='{spec}': not valid YAML at line 2, column 1: duplicate key 'base'"),
    ("duplicate-base-field", "base:\n  total_steps: 1024\n  total_steps: 2048\n", [],
     "spec='{spec}': not valid YAML at line 3, column 3: duplicate key 'total_steps'"),
    ("duplicate-grid-axis", "grid:\n  ppo.lr: [0.1]\n  ppo.lr: [0.2]\n", [],
     "spec='{spec}': not valid YAML at line 3, column 3: duplicate key 'ppo.lr'"),
    ("alias-bomb", BOMB + "base: {ppo.lr: *i}\n", [],
     "spec='{spec}': not valid YAML at line "),
    ("long-value", "preset: " + "x" * 100_000 + "\n", [], "preset='xxxxx"),
    # fields a sweep sets itself: a grid or override of them was ignored (or ran seed 0)
    ("grid-seed", "grid: {seed: [0, 1]}\n", [], "grid.seed=[0, 1]: a sweep sets seed itself"),
    ("grid-out", "grid: {out: [a, b]}\n", [], "grid.out=['a', 'b']: a sweep sets out itself"),
    ("grid-runs-root", "grid: {runs_root: [a]}\n", [], "grid.runs_root=['a']: a sweep sets"),
    ("base-seed", "base: {seed: 3}\n", [], "base.seed=3: a sweep sets seed itself"),
    ("base-out", "base: {out: x}\n", [], "base.out='x': a sweep sets out itself"),
    ("condition-out", "conditions: {c: {out: x}}\n", [], "conditions.c.out='x': a sweep sets"),
    ("grid-resume", "grid: {resume: [true]}\n", [], "grid.resume=True: unknown config field"),
    # a grid far beyond what anyone means
    ("too-many-runs", "grid: {{ppo.lr: [{0}], kl.target: [{0}]}}\nseeds: [{1}]\n".format(
        ", ".join(str(0.001 * i) for i in range(1, 101)), ", ".join(map(str, range(20)))),
     [], "runs=200000: the spec asks for 200,000 runs"),
]

#: (id, flags, the message's start); the spec is GOOD
FLAG_CASES = [
    ("objectives-with-spec", ["--objectives", "clip"], "--objectives=['clip']: the spec"),
    ("preset-with-spec", ["--preset", "klip/hopper"], "--preset='klip/hopper': the spec"),
    ("out-empty", ["--out", ""], "argument --out: '' names no path"),
    ("workers-0", ["--workers", "0"], "--workers=0: must be >= 1"),
    ("workers-negative", ["--workers", "-2"], "--workers=-2: must be >= 1"),
    ("workers-huge", ["--workers", "100000"], "--workers=100000: must be >= 1 and at most 1,024"),
    ("set-no-equals", ["--set", "ppo.lr"], "--set='ppo.lr': expected FIELD=VALUE"),
    ("set-no-field", ["--set", "=3"], "--set='=3': expected FIELD=VALUE"),
    ("set-no-value", ["--set", "ppo.lr="], "--set='ppo.lr=': expected FIELD=VALUE"),
    ("set-bad-yaml", ["--set", "ppo.lr=[1"], "--set='ppo.lr=[1': '[1' is not a YAML value"),
    ("set-unknown-field", ["--set", "ppo.nope=1"], "base.ppo.nope=1: unknown config field"),
    ("grid-no-equals", ["--grid", "kl.target"], "--grid='kl.target': expected FIELD=V1,V2"),
    ("grid-empty-value", ["--grid", "kl.target=0.01,,0.02"], "--grid='kl.target=0.01,,0.02': "),
    ("grid-no-values", ["--grid", "kl.target="], "--grid='kl.target=': expected FIELD=V1,V2"),
    ("seeds-negative", ["--seeds", "-1"], "seeds=[-1]: "),
    ("seeds-duplicate", ["--seeds", "1", "1"], "seeds=[1, 1]: "),
    ("out-is-a-file", ["--out", "{tmp}/file"], "--out='{tmp}/file': exists and is not a directory"),
    # issue 19: a second --set or --grid replaced the first; now they add up, once per field
    ("set-twice-same-field", ["--set", "ppo.lr=0.1", "--set", "ppo.lr=0.2"],
     "--set='ppo.lr=0.2': ppo.lr is given twice"),
    ("grid-twice-same-field", ["--grid", "kl.target=0.01", "--grid", "kl.target=0.03"],
     "--grid='kl.target=0.03': kl.target is given twice"),
    ("set-grid-seed", ["--grid", "seed=0,1"], "grid.seed=[0, 1]: a sweep sets seed itself"),
    ("set-out", ["--set", "out=x"], "base.out='x': a sweep sets out itself"),
    ("max-runs-zero", ["--max-runs", "0"], "--max-runs=0: must be >= 1"),
    ("max-runs-below", ["--grid", "ppo.lr=0.1,0.2,0.3", "--max-runs", "2"],
     "runs=3: the spec asks for 3 runs"),
    ("too-many-runs", ["--grid", "ppo.lr=" + ",".join(str(0.001 * i) for i in range(1, 101)),
                       "--grid", "ppo.eps=" + ",".join(str(0.01 * i) for i in range(1, 11)),
                       "--seeds", *map(str, range(11))], "runs=11000: the spec asks for 11,000"),
]


def check_one_line_error(capsys, code, command, expected):
    cap = capsys.readouterr()
    assert code == 2
    lines = cap.err.splitlines()
    assert len(lines) == 1, cap.err
    assert len(lines[0]) <= 300, lines[0][:400]
    assert lines[0].startswith(f"klppo {command}: {expected}"), lines[0]
    assert "Traceback" not in cap.err + cap.out
    assert cap.out == ""


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_bad_spec_is_one_line_and_creates_nothing(tmp_path, capsys, case):
    _, text, flags, expected = case
    spec = tmp_path / "spec.yaml"
    if text is not None:
        spec.write_bytes(text if isinstance(text, bytes) else text.encode())
        flags = ["--spec", str(spec), *flags]
    out = tmp_path / "sweep"
    fill = {"tmp": str(tmp_path), "spec": str(spec)}
    code = main(["sweep", "--out", str(out), *[f.format(**fill) for f in flags]])
    check_one_line_error(capsys, code, "sweep", expected.format(**fill))
    assert not out.exists()


@pytest.mark.parametrize("case", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_bad_flag_is_one_line_and_creates_nothing(tmp_path, capsys, case):
    _, flags, expected = case
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD)
    (tmp_path / "file").write_text("")
    fill = {"tmp": str(tmp_path)}
    flags = [f.format(**fill) for f in flags]
    out = [] if "--out" in flags else ["--out", str(tmp_path / "sweep")]
    code = run_main(["sweep", "--spec", str(spec), *out, *flags])
    check_one_line_error(capsys, code, "sweep", expected.format(**fill))
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("flags, expected", [
    (["--workers", "0"], "--workers=0: must be >= 1"),
    (["--seeds", "-1"], "seeds=[-1]: "),
    (["--seeds", "2", "2"], "seeds=[2, 2]: "),
], ids=["workers-0", "seeds-negative", "seeds-duplicate"])
def test_bad_demo_flags_are_one_line_and_create_nothing(tmp_path, capsys, flags, expected):
    code = main(["demo", "--out", str(tmp_path / "demo"), *flags])
    check_one_line_error(capsys, code, "demo", expected)
    assert not (tmp_path / "demo").exists()


def test_a_sweep_directory_in_use_is_refused_naming_the_holder(tmp_path, capsys):
    spec, out = tmp_path / "spec.yaml", tmp_path / "sweep"
    spec.write_text(GOOD)
    out.mkdir()
    with R.DirLock(out, "sweep directory"):
        code = main(["sweep", "--spec", str(spec), "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 2 and len(cap.err.splitlines()) == 1
    assert cap.err.startswith(f"klppo sweep: sweep directory {str(out)!r} is in use by pid ")
    assert cap.out == ""  # "sweep: N runs into ..." comes once the sweep starts
    assert not (out / "spec.yaml").exists() and not (out / "runs").exists()


def test_a_real_process_prints_no_traceback(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("seeds: 0\n")
    proc = subprocess.run([sys.executable, "-m", "klppo", "sweep", "--spec", str(spec), "--out",
                           str(tmp_path / "sweep")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "klppo sweep: seeds=0: must be a non-empty list of distinct integers >= 0"]
    assert proc.stdout == "" and not (tmp_path / "sweep").exists()


def _args(tmp_path, *flags):
    from klppo.cli import build_parser

    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD)
    return build_parser().parse_args(["sweep", "--spec", str(spec), "--out",
                                      str(tmp_path / "sweep"), *flags])


def test_repeated_set_and_grid_flags_add_up(tmp_path):
    """A second --set or --grid used to replace the first (an axis dropped without a word)."""
    from klppo.cli.sweep import spec_from_args

    spec = spec_from_args(_args(tmp_path, "--set", "ppo.lr=1e-4", "--set", "ppo.eps=0.1",
                                "--grid", "kl.target=0.01,0.02", "--grid", "ppo.gamma=0.9,0.99"))
    assert spec.base["ppo.lr"] == 1e-4 and spec.base["ppo.eps"] == 0.1  # YAML 1.2 numbers
    assert spec.grid == {"kl.target": [0.01, 0.02], "ppo.gamma": [0.9, 0.99]}


def test_spec_numbers_are_read_as_config_files_read_them(tmp_path):
    """``1e-4`` is a float in a spec as in ``train --config`` (YAML 1.1 read a string)."""
    from klppo.experiments.sweep import expand, load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {ppo.lr: 1e-4, total_steps: 1024}\ngrid: {kl.target: [2e-2, 3E-2]}\n"
                    "seeds: [0]\n")
    plans = expand(load_spec(spec))
    assert [p.config.ppo.lr for p in plans] == [1e-4, 1e-4]
    assert [p.config.kl.target for p in plans] == [0.02, 0.03]


def _existing_sweep(tmp_path):
    """A sweep directory as a first launch left it (spec.yaml, runs/NAME/config.yaml)."""
    import dataclasses

    from klppo.experiments.sweep import expand, load_spec

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(GOOD)
    out = tmp_path / "sweep"
    run = out / "runs" / expand(load_spec(spec_file))[0].name
    run.mkdir(parents=True)
    R.write_yaml(out / "spec.yaml", dataclasses.asdict(load_spec(spec_file)))
    (run / "config.yaml").write_text("seed: 0\n")
    return spec_file, out, run


@pytest.mark.parametrize("damage, expected", [
    ("spec-yaml", "spec='{out}/spec.yaml': not valid YAML at line "),
    ("spec-not-utf8", "spec='{out}/spec.yaml': not UTF-8 text"),
    ("status-not-json", "status='{run}/status.json': not valid JSON"),
    ("status-list", "status='{run}/status.json': ['finished'] is not a run status"),
    ("status-not-utf8", "status='{run}/status.json': not UTF-8 text"),
    ("status-state-int", "status='{run}/status.json': {{'state': 3}} is not a run status"),
])
def test_a_damaged_sweep_directory_is_one_line_naming_the_file(tmp_path, capsys, damage,
                                                              expected):
    spec_file, out, run = _existing_sweep(tmp_path)
    target, data = {
        "spec-yaml": (out / "spec.yaml", b"preset: [klip\n"),
        "spec-not-utf8": (out / "spec.yaml", b"preset: \xff\n"),
        "status-not-json": (run / "status.json", b'{"state": "fini'),
        "status-list": (run / "status.json", b'["finished"]'),
        "status-not-utf8": (run / "status.json", b'{"state": "\xff"}'),
        "status-state-int": (run / "status.json", b'{"state": 3}'),
    }[damage]
    target.write_bytes(data)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"}
    code = main(["sweep", "--spec", str(spec_file), "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 2 and len(cap.err.splitlines()) == 1 and "Traceback" not in cap.err, cap.err
    assert cap.err.startswith(f"klppo sweep: {expected.format(out=out, run=run)}"), cap.err
    assert cap.out == ""  # the refusal alone: "sweep: N runs into" comes once it starts
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before  # no run directory, index or status written


def test_ctrl_c_before_the_command_starts_is_one_line_and_130(monkeypatch, capsys):
    """Ctrl-C while klppo is still importing (the first second) was a KeyboardInterrupt
    traceback."""
    import klppo.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(klppo.cli, "build_parser", interrupted)
    assert main(["sweep", "--out", "x"]) == 130
    cap = capsys.readouterr()
    assert cap.err == "klppo sweep: interrupted\n" and cap.out == ""


def test_an_import_broken_by_ctrl_c_is_an_interrupt_not_a_missing_extra():
    from klppo.rl.envs import _missing_extra

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise ImportError("cannot import name 'MjModel' (partially initialized)") from k
    except ImportError as e:
        with pytest.raises(KeyboardInterrupt):
            _missing_extra("Hopper-v5", e)
        assert "needs the mujoco extra" in str(_missing_extra("Hopper-v5", ImportError("x")))


def test_a_run_stopped_while_building_its_envs_is_interrupted_not_failed(tmp_path):
    """Ctrl-C on a sweep while a worker was still making its envs recorded the run FAILED with
    a false "needs the mujoco extra"."""
    import time
    from types import SimpleNamespace

    from klppo.experiments import launch as L

    job = L.Job(tmp_path, SimpleNamespace(returncode=1), time.time() - 1, 0, stop_level=1)
    R.write_status(tmp_path, "failed", error="cannot start: EnvError: env='Hopper-v5' needs the "
                   "mujoco extra: pip install -c constraints.txt -e '.[mujoco]'", iteration=0)
    res = L.outcome(job, 1)
    assert res["state"] == "interrupted" and res["error"] is None
    status = R.read_status(tmp_path)
    assert status["state"] == "interrupted" and "mujoco" not in status["error"]
    job.stop_level = 0  # not asked to stop: a failed start is a failure
    R.write_status(tmp_path, "failed", error="cannot start: EnvError: boom", iteration=0)
    assert L.outcome(job, 1)["state"] == "failed"


def test_a_runs_path_that_is_a_file_is_refused_before_anything_is_written(tmp_path):
    """(issue #32) ``OUT/runs`` a file: one line naming it, no spec.yaml or .lock left."""
    from klppo.experiments.sweep import SweepSpec, run_sweep
    from klppo.runs.errors import ConfigError

    out = tmp_path / "sw"
    out.mkdir()
    (out / "runs").write_text("not a directory")
    spec = SweepSpec(preset="klip/cartpole", base={"total_steps": 1024}, seeds=[0],
                     conditions={"clip": {"objective": "clip"}})
    with pytest.raises(ConfigError, match="its 'runs' is a file") as e:
        run_sweep(spec, out)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in out.iterdir()) == ["runs"]
