"""Bad input to ``klppo sweep`` / ``klppo demo``: one line on stderr, exit code 2, no traceback,
and nothing created."""

import subprocess
import sys
from pathlib import Path

import pytest

from klppo.cli import main
from klppo.runs import rundir as R

ROOT = Path(__file__).resolve().parents[2]
GOOD = "base: {total_steps: 1024, tensorboard: false}\nseeds: [0]\n"

#: (id, spec file text (bytes: raw; None: no --spec), extra flags, the message's start)
SPEC_CASES = [
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
    ("bad-yaml", "seeds: [0, 1\n", [], "spec='{spec}': not valid YAML (line "),
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
    ("base-unknown-field", "base: {ppo.nope: 1}\n", [], "base.ppo.nope: unknown config field"),
    ("base-conflict", "base: {ppo: 1, ppo.lr: 1}\n", [], "base.ppo.lr=1: conflicts with ppo=1"),
    ("base-bad-value", "base: {total_steps: -5}\n", [], "total_steps=-5: must be an integer"),
    # the field is named once config.from_dict checks types; till then validate's TypeError
    ("base-bad-type", "base: {ppo.lr: fast}\n", [], ""),
    ("grid-bad-type", "grid: {ppo.lr: [fast]}\n", [], ""),
    ("hidden-bad-type", "base: {net.hidden: 3}\n", [], "base"),
    ("condition-bad-value", "conditions: {c: {objective: nope}}\n", [],
     "objective='nope': must be one of"),
]

#: (id, flags, the message's start); the spec is GOOD
FLAG_CASES = [
    ("workers-0", ["--workers", "0"], "--workers=0: must be >= 1"),
    ("workers-negative", ["--workers", "-2"], "--workers=-2: must be >= 1"),
    ("set-no-equals", ["--set", "ppo.lr"], "--set='ppo.lr': expected FIELD=VALUE"),
    ("set-no-field", ["--set", "=3"], "--set='=3': expected FIELD=VALUE"),
    ("set-no-value", ["--set", "ppo.lr="], "--set='ppo.lr=': expected FIELD=VALUE"),
    ("set-bad-yaml", ["--set", "ppo.lr=[1"], "--set='ppo.lr=[1': '[1' is not a YAML value"),
    ("set-unknown-field", ["--set", "ppo.nope=1"], "base.ppo.nope: unknown config field"),
    ("grid-no-equals", ["--grid", "kl.target"], "--grid='kl.target': expected FIELD=V1,V2"),
    ("grid-empty-value", ["--grid", "kl.target=0.01,,0.02"], "--grid='kl.target=0.01,,0.02': "),
    ("grid-no-values", ["--grid", "kl.target="], "--grid='kl.target=': expected FIELD=V1,V2"),
    ("seeds-negative", ["--seeds", "-1"], "seeds=[-1]: "),
    ("seeds-duplicate", ["--seeds", "1", "1"], "seeds=[1, 1]: "),
    ("out-is-a-file", ["--out", "{tmp}/file"], "--out='{tmp}/file': exists and is not a directory"),
]


def check_one_line_error(capsys, code, command, expected):
    cap = capsys.readouterr()
    assert code == 2
    lines = cap.err.splitlines()
    assert len(lines) == 1, cap.err
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
    code = main(["sweep", "--spec", str(spec), *out, *flags])
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
